//! The terminal text model: a [`vte::Perform`] that turns bytes into the rows a person sees.
//!
//! The model is a bounded grid of `rows` rows, the *live region*: the part of the screen that
//! cursor movement can still reach and rewrite. Columns are not bounded by a terminal width
//! (a long line stays one row, so a directive the terminal would wrap stays whole), only by
//! [`MAX_COLS`] for memory.
//!
//! A row becomes *final* and is handed to the scanner as a [`CommittedLine`] when
//! - it scrolls out of the top of the live region (no cursor movement can reach it again),
//! - [`Screen::commit_above_cursor`] is called because the stream went quiet, or
//! - [`Screen::commit_all`] is called at the end of the stream.
//!
//! A committed row remembers a hash of what it held; if it is later rewritten with the same
//! text (a TUI redrawing its region) it is not committed again. Erasing uncommitted rows
//! (erase-line, erase-display, a clear screen) drops them: text that was only shown while a
//! TUI was still redrawing was never final. Every upward cursor move and every clear is
//! reported as an [`Event::Repaint`] so the caller can recognise directives shown again.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

/// Longest row kept, in cells: a directive up to the body limit fits on one logical row
/// (raw output has no autowrap: a long line is one row). Printing past it drops characters
/// and marks the row as overflowed, so that nothing read from it is taken as whole.
pub(crate) const MAX_COLS: usize = crate::scanner::MAX_BODY + 1024;
/// Upper bound for the live region's height, whatever the caller asks for.
pub(crate) const MAX_ROWS: usize = 200;
/// How far above the cursor [`Screen::shows_near_cursor`] looks.
const STATUS_ROWS: usize = 12;
/// Live region height used when the caller does not know the terminal size.
pub(crate) const DEFAULT_ROWS: usize = 100;

/// One character cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cell {
    pub(crate) ch: char,
    /// Printed with an explicit foreground colour, or faint. Claude Code shows prose in the
    /// default colour and code (syntax-highlighted blocks, inline code) in colours; its
    /// detailed transcript (Ctrl+O) shows thinking faint.
    pub(crate) code: bool,
}

const BLANK: Cell = Cell {
    ch: ' ',
    code: false,
};

#[derive(Debug, Default, Clone)]
struct Row {
    cells: Vec<Cell>,
    /// Characters were printed past [`MAX_COLS`] and dropped.
    overflow: bool,
    /// Hash of the text when this row was last committed.
    committed: Option<u64>,
}

impl Row {
    fn hash(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        let end = trimmed_len(&self.cells);
        for c in &self.cells[..end] {
            c.ch.hash(&mut h);
            c.code.hash(&mut h);
        }
        h.finish()
    }
}

/// Makes room for `cells[col]`, padding with blanks; capacity never exceeds [`MAX_COLS`], so
/// a row's memory stays bounded.
fn pad_to(cells: &mut Vec<Cell>, col: usize) {
    let need = col + 1;
    if cells.capacity() < need {
        let want = (cells.capacity() * 2).clamp(16, MAX_COLS).max(need);
        cells.reserve_exact(want - cells.len());
    }
    if cells.len() < col {
        cells.resize(col, BLANK);
    }
}

fn trimmed_len(cells: &[Cell]) -> usize {
    cells.iter().rposition(|c| c.ch != ' ').map_or(0, |i| i + 1)
}

/// A final row of text, in the order rows became final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommittedLine {
    /// Absolute row number since the stream started (never reused).
    pub(crate) row: u64,
    /// The row's characters, trailing spaces removed; one `char` per cell.
    pub(crate) text: String,
    /// Per character: shown in a code colour. Empty when no cell is.
    pub(crate) code: Vec<bool>,
    /// Read before, unchanged: passed on only as context between changed rows (a blank line
    /// that ends a paragraph), never to be read for directives again.
    pub(crate) seen: bool,
    /// The row was longer than [`MAX_COLS`]: `text` is only its start.
    pub(crate) overflow: bool,
}

/// What the screen reports to the scanner, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A row became final.
    Line(CommittedLine),
    /// What follows may show again what was shown from absolute row `from_row` on.
    Repaint { from_row: u64 },
    /// The screen was cleared (rows not yet final were dropped); comes before its repaint.
    Clear,
}

/// Screen state between feeds. See the module docs.
#[derive(Debug)]
pub(crate) struct Screen {
    grid: VecDeque<Row>,
    /// Absolute row number of `grid[0]`.
    base: u64,
    rows: usize,
    cur_row: usize,
    cur_col: usize,
    saved: (usize, usize),
    code_fg: bool,
    /// SGR 2 (faint) is on.
    faint: bool,
    /// The main screen while the alternate screen is shown.
    saved_main: Option<(VecDeque<Row>, u64, usize, usize)>,
    /// The scrolling region set by DECSTBM (`ESC [ top ; bottom r`), as screen rows (first,
    /// last), when it is not the whole screen. Codex CLI drawn inline (`--no-alt-screen`)
    /// writes its history above its input box this way: line feeds at the region's bottom
    /// scroll only the region, and reverse index at its top scrolls it down, while the box
    /// below stays where it is.
    region: Option<(usize, usize)>,
    /// What happened, in order: committed rows and repaints.
    pub(crate) out: Vec<Event>,
    /// Whether the vte parser is surely in its ground state with no UTF-8 character pending
    /// (see [`crate::Parser::feed`]'s fast path). False is always safe.
    pub(crate) ground: bool,
}

impl Screen {
    pub(crate) fn new(rows: usize) -> Self {
        let mut grid = VecDeque::new();
        grid.push_back(Row::default());
        Self {
            grid,
            base: 0,
            rows: rows.clamp(1, MAX_ROWS),
            cur_row: 0,
            cur_col: 0,
            saved: (0, 0),
            code_fg: false,
            faint: false,
            saved_main: None,
            region: None,
            out: Vec::new(),
            ground: true,
        }
    }

    pub(crate) fn set_rows(&mut self, rows: usize) {
        let rows = rows.clamp(1, MAX_ROWS);
        if rows != self.rows {
            // A resized terminal (tmux, xterm) resets its scrolling region to the whole screen.
            self.region = None;
        }
        // A terminal made shorter (tmux's `screen_resize_y`, xterm) first drops the rows below
        // the cursor, and only then scrolls rows off the top: the cursor's row and what is
        // above it stay on screen. (Scrolling the top off first lost a prompt drawn near the
        // top of a tall pane when a person attached from a shorter terminal: the wrapper then
        // saw no input line until the agent drew again.) Only empty rows are dropped here: a
        // row with text below the cursor (a TUI drawing upwards) is read as before, scrolled
        // off the top and committed, never lost.
        while self.grid.len() > rows
            && self.grid.len() > self.cur_row + 1
            && self.grid.back().is_some_and(|r| trimmed_len(&r.cells) == 0)
        {
            self.grid.pop_back();
        }
        self.rows = rows;
        self.trim_top();
    }

    /// Bytes held by the grid (for the memory bound).
    pub(crate) fn buffered_bytes(&self) -> usize {
        let grid: usize = self
            .grid
            .iter()
            .map(|r| r.cells.capacity() * size_of::<Cell>())
            .sum();
        let alt: usize = self.saved_main.as_ref().map_or(0, |(g, ..)| {
            g.iter()
                .map(|r| r.cells.capacity() * size_of::<Cell>())
                .sum()
        });
        let out: usize = self
            .out
            .iter()
            .map(|e| match e {
                Event::Line(l) => l.text.capacity() + l.code.capacity(),
                Event::Repaint { .. } | Event::Clear => 0,
            })
            .sum();
        grid + alt + out + (self.grid.len() * size_of::<Row>())
    }

    fn line_of(row: &Row, abs: u64) -> CommittedLine {
        let end = trimmed_len(&row.cells);
        let cells = &row.cells[..end];
        let text: String = cells.iter().map(|c| c.ch).collect();
        let code = if cells.iter().any(|c| c.code) {
            cells.iter().map(|c| c.code).collect()
        } else {
            Vec::new()
        };
        CommittedLine {
            row: abs,
            text,
            code,
            seen: false,
            overflow: row.overflow,
        }
    }

    /// Commits `row` if it changed since it was last committed; returns whether it did.
    fn commit(out: &mut Vec<Event>, row: &mut Row, abs: u64) -> bool {
        let h = row.hash();
        if row.committed == Some(h) {
            return false;
        }
        row.committed = Some(h);
        out.push(Event::Line(Self::line_of(row, abs)));
        true
    }

    /// Commits rows `0..end` in screen order. Unchanged rows before the first changed one are
    /// skipped; unchanged rows after it are passed on as `seen` context, so that a TUI that
    /// redraws its whole screen shifted by a line still shows the scanner its blank lines.
    fn commit_rows(&mut self, end: usize) {
        let mut changed = false;
        for i in 0..end.min(self.grid.len()) {
            let abs = self.base + i as u64;
            let row = &mut self.grid[i];
            if Self::commit(&mut self.out, row, abs) {
                changed = true;
            } else if changed {
                let mut line = Self::line_of(row, abs);
                line.seen = true;
                self.out.push(Event::Line(line));
            }
        }
    }

    /// The row under the cursor as it reads now, without making it final.
    pub(crate) fn cursor_line(&self) -> CommittedLine {
        let abs = self.base + self.cur_row as u64;
        self.grid.get(self.cur_row).map_or_else(
            || CommittedLine {
                row: abs,
                text: String::new(),
                code: Vec::new(),
                seen: false,
                overflow: false,
            },
            |row| Self::line_of(row, abs),
        )
    }

    /// Whether a row near the cursor (where TUIs keep their status line) shows one of
    /// `markers` (lowercase), compared ignoring case.
    pub(crate) fn shows_near_cursor(&self, markers: &[String]) -> bool {
        if markers.is_empty() {
            return false;
        }
        let from = self.cur_row.saturating_sub(STATUS_ROWS);
        self.grid.iter().skip(from).any(|row| {
            // Markers come lowercased (`Profile::with_busy_markers`).
            let text: String = row.cells.iter().flat_map(|c| c.ch.to_lowercase()).collect();
            markers.iter().any(|m| text.contains(m.as_str()))
        })
    }

    /// The rows the terminal shows now (trailing spaces removed) and the cursor's position
    /// in them (row, column).
    pub(crate) fn visible(&self) -> (Vec<String>, usize, usize) {
        let start = self.grid.len().saturating_sub(self.rows);
        let lines = self
            .grid
            .iter()
            .skip(start)
            .map(|r| {
                r.cells[..trimmed_len(&r.cells)]
                    .iter()
                    .map(|c| c.ch)
                    .collect()
            })
            .collect();
        (lines, self.cur_row.saturating_sub(start), self.cur_col)
    }

    /// Rows above the cursor are final now (the stream went quiet).
    pub(crate) fn commit_above_cursor(&mut self) {
        self.commit_rows(self.cur_row);
    }

    /// Every row is final now (end of stream).
    pub(crate) fn commit_all(&mut self) {
        // Trailing empty rows carry nothing.
        if let Some(last) = self.grid.iter().rposition(|r| trimmed_len(&r.cells) > 0) {
            self.commit_rows(last + 1);
        }
    }

    fn trim_top(&mut self) {
        while self.grid.len() > self.rows {
            if let Some(mut row) = self.grid.pop_front() {
                Self::commit(&mut self.out, &mut row, self.base);
            }
            self.base += 1;
            self.cur_row = self.cur_row.saturating_sub(1);
            self.saved.0 = self.saved.0.saturating_sub(1);
        }
    }

    fn line_feed(&mut self) {
        if let Some((top, bottom)) = self.region {
            if self.cur_row == bottom {
                self.scroll_up(top, bottom, 1);
                return;
            }
            if self.cur_row > bottom {
                // Below the region nothing scrolls: the cursor stops at the last row.
                let target = (self.cur_row + 1).min(self.rows - 1);
                self.set_row(target);
                return;
            }
        }
        self.cur_row += 1;
        while self.grid.len() <= self.cur_row {
            self.grid.push_back(Row::default());
        }
        self.trim_top();
    }

    /// Reverse index (`ESC M`): up one row, or at the top of the scrolling region, the
    /// region scrolls down by one.
    fn reverse_index(&mut self) {
        match self.region {
            Some((top, bottom)) if self.cur_row == top => self.scroll_down(top, bottom, 1),
            _ => self.move_up(1),
        }
    }

    fn fill_to(&mut self, row: usize) {
        while self.grid.len() <= row {
            self.grid.push_back(Row::default());
        }
    }

    /// Scrolls screen rows `top..=bottom` up by `n`: blank rows come in at `bottom`. Rows that
    /// leave the top of the screen are final, as when the whole screen scrolls; rows that
    /// leave a region starting lower are gone (erased). Rows below the region stay put.
    fn scroll_up(&mut self, top: usize, bottom: usize, n: usize) {
        let n = n.min(bottom + 1 - top);
        self.fill_to(bottom);
        for _ in 0..n {
            if top == 0 {
                if let Some(mut row) = self.grid.pop_front() {
                    Self::commit(&mut self.out, &mut row, self.base);
                }
                self.base += 1;
            } else {
                self.grid.remove(top);
                self.repaint(self.base + top as u64);
            }
            self.grid.insert(bottom, Row::default());
        }
        if self.grid.len() > bottom + 1 {
            // The rows below kept their places on the screen, so their numbers moved on:
            // they may show again what they showed.
            self.repaint(self.base + bottom as u64 + 1);
        }
    }

    /// Deletes `n` rows at screen row `at` inside the region ending at `bottom`: the rows under
    /// them move up, blank rows come in at `bottom`. Deleted rows are gone (erased), even at
    /// the top of the screen: unlike scrolling, deleting does not make history.
    fn delete_rows(&mut self, at: usize, bottom: usize, n: usize) {
        let n = n.min(bottom + 1 - at);
        self.fill_to(bottom);
        for _ in 0..n {
            self.grid.remove(at);
            self.grid.insert(bottom, Row::default());
        }
        self.repaint(self.base + at as u64);
    }

    /// Scrolls screen rows `top..=bottom` down by `n`: blank rows come in at `top`, rows
    /// pushed past `bottom` are gone (erased).
    fn scroll_down(&mut self, top: usize, bottom: usize, n: usize) {
        let n = n.min(bottom + 1 - top);
        self.fill_to(bottom);
        for _ in 0..n {
            self.grid.remove(bottom);
            self.grid.insert(top, Row::default());
        }
        self.repaint(self.base + top as u64);
    }

    /// The scrolling region rows, whole screen when none is set.
    fn margins(&self) -> (usize, usize) {
        self.region.unwrap_or((0, self.rows - 1))
    }

    fn move_up(&mut self, n: usize) {
        let target = self.cur_row.saturating_sub(n);
        self.set_row(target);
    }

    fn set_row(&mut self, target: usize) {
        let target = target.min(self.rows - 1);
        if target < self.cur_row {
            self.repaint(self.base + target as u64);
        }
        self.cur_row = target;
        while self.grid.len() <= self.cur_row {
            self.grid.push_back(Row::default());
        }
    }

    /// Absolute screen row `r` (0-based): the screen is the last `rows` rows of the grid.
    fn screen_row(&self, r: usize) -> usize {
        // The grid never holds more than `rows` rows, so screen row 0 is grid row 0 once the
        // grid is full; before that, the screen's top is the grid's top as well.
        r
    }

    /// Records a repaint; consecutive ones merge (the scanner treats them the same way).
    fn repaint(&mut self, from_row: u64) {
        if let Some(Event::Repaint { from_row: last }) = self.out.last_mut() {
            *last = (*last).min(from_row);
        } else {
            self.out.push(Event::Repaint { from_row });
        }
    }

    fn row_mut(&mut self) -> &mut Row {
        while self.grid.len() <= self.cur_row {
            self.grid.push_back(Row::default());
        }
        let i = self.cur_row.min(self.grid.len() - 1);
        &mut self.grid[i]
    }

    fn erase_in_row(&mut self, from: usize, to: usize) {
        let row = self.row_mut();
        if from == 0 && to >= row.cells.len() {
            // The whole row is rewritten: what was dropped from it is gone too.
            row.overflow = false;
        }
        if to >= row.cells.len() {
            row.cells.truncate(from);
        } else if from < to {
            row.cells[from..to].fill(BLANK);
        }
        let end = trimmed_len(&row.cells);
        row.cells.truncate(end);
    }

    /// Clears the whole screen: uncommitted text is dropped, and what follows may re-show
    /// what was shown before.
    fn clear_all(&mut self) {
        self.base += self.grid.len() as u64;
        self.grid.clear();
        self.grid.push_back(Row::default());
        self.cur_row = 0;
        self.cur_col = 0;
        self.out.push(Event::Clear);
        self.repaint(0);
    }

    fn sgr<'a>(&mut self, groups: impl Iterator<Item = &'a [u16]>) {
        let mut it = groups.peekable();
        if it.peek().is_none() {
            self.code_fg = false;
            self.faint = false;
        }
        while let Some(p) = it.next() {
            match p.first().copied().unwrap_or(0) {
                0 => {
                    self.code_fg = false;
                    self.faint = false;
                }
                39 => self.code_fg = false,
                2 => self.faint = true,
                22 => self.faint = false,
                30..=37 | 90..=97 => self.code_fg = true,
                38 => {
                    if p.len() > 1 {
                        // Colon form: 38:5:n or 38:2:[cs:]r:g:b.
                        self.code_fg = matches!(p.get(1), Some(2 | 5));
                    } else {
                        match it.next().and_then(|q| q.first().copied()) {
                            Some(5) => {
                                it.next();
                                self.code_fg = true;
                            }
                            Some(2) => {
                                it.next();
                                it.next();
                                it.next();
                                self.code_fg = true;
                            }
                            _ => {}
                        }
                    }
                }
                // Background / underline colour: skip its arguments.
                48 | 58 if p.len() == 1 => match it.next().and_then(|q| q.first().copied()) {
                    Some(5) => {
                        it.next();
                    }
                    Some(2) => {
                        it.next();
                        it.next();
                        it.next();
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }

    /// Everything but SGR and private modes; shared by vte's dispatch and the fast path.
    fn csi(&mut self, action: char, a: &Args) {
        match action {
            'A' => self.move_up(a.get(0, 1)),
            'B' | 'e' => {
                let target = (self.cur_row + a.get(0, 1)).min(self.rows - 1);
                self.set_row(target.max(self.cur_row));
            }
            'C' | 'a' => self.cur_col = (self.cur_col + a.get(0, 1)).min(MAX_COLS),
            'D' => self.cur_col = self.cur_col.saturating_sub(a.get(0, 1)),
            'E' => {
                let target = (self.cur_row + a.get(0, 1)).min(self.rows - 1);
                self.set_row(target.max(self.cur_row));
                self.cur_col = 0;
            }
            'F' => {
                self.move_up(a.get(0, 1));
                self.cur_col = 0;
            }
            'G' | '`' => self.cur_col = (a.get(0, 1) - 1).min(MAX_COLS),
            'H' | 'f' => {
                let r = self.screen_row(a.get(0, 1) - 1);
                self.set_row(r);
                self.cur_col = (a.get(1, 1) - 1).min(MAX_COLS);
            }
            'd' => {
                let r = self.screen_row(a.get(0, 1) - 1);
                self.set_row(r);
            }
            'J' => match a.get(0, 0) {
                0 => {
                    let col = self.cur_col;
                    self.erase_in_row(col, MAX_COLS);
                    self.grid.truncate(self.cur_row + 1);
                }
                1 => {
                    for i in 0..self.cur_row.min(self.grid.len()) {
                        self.grid[i].cells.clear();
                    }
                    let col = self.cur_col;
                    self.erase_in_row(0, col + 1);
                }
                _ => self.clear_all(),
            },
            'K' => {
                let col = self.cur_col;
                match a.get(0, 0) {
                    0 => self.erase_in_row(col, MAX_COLS),
                    1 => self.erase_in_row(0, col + 1),
                    _ => self.erase_in_row(0, MAX_COLS),
                }
            }
            'X' => {
                let col = self.cur_col;
                let n = a.get(0, 1);
                self.erase_in_row(col, col.saturating_add(n));
            }
            'P' => {
                let col = self.cur_col;
                let n = a.get(0, 1);
                let row = self.row_mut();
                if col < row.cells.len() {
                    let end = col.saturating_add(n).min(row.cells.len());
                    row.cells.drain(col..end);
                }
            }
            '@' => {
                let col = self.cur_col;
                let n = a.get(0, 1).min(MAX_COLS);
                let row = self.row_mut();
                if col < row.cells.len() {
                    row.cells.splice(col..col, std::iter::repeat_n(BLANK, n));
                    row.cells.truncate(MAX_COLS);
                    row.cells.shrink_to(MAX_COLS);
                }
            }
            'L' | 'M' if self.region.is_some() => {
                // Inside the region, lines are inserted or deleted within it; outside,
                // terminals ignore both.
                let (top, bottom) = self.margins();
                if (top..=bottom).contains(&self.cur_row) {
                    let n = a.get(0, 1);
                    if action == 'L' {
                        self.scroll_down(self.cur_row, bottom, n);
                    } else {
                        self.delete_rows(self.cur_row, bottom, n);
                    }
                }
            }
            'r' => {
                let top = a.get(0, 1) - 1;
                let bottom = a.get(1, self.rows).min(self.rows) - 1;
                if top < bottom {
                    self.region = (top > 0 || bottom < self.rows - 1).then_some((top, bottom));
                    // DECSTBM homes the cursor.
                    self.set_row(0);
                    self.cur_col = 0;
                }
            }
            'S' => {
                let (top, bottom) = self.margins();
                self.scroll_up(top, bottom, a.get(0, 1));
            }
            'T' => {
                let (top, bottom) = self.margins();
                self.scroll_down(top, bottom, a.get(0, 1));
            }
            'L' => {
                let n = a.get(0, 1).min(self.rows);
                let at = self.cur_row.min(self.grid.len());
                for _ in 0..n {
                    self.grid.insert(at, Row::default());
                }
                self.grid.truncate(self.rows.max(self.cur_row + 1));
                self.repaint(self.base + at as u64);
            }
            'M' => {
                let n = a.get(0, 1);
                let at = self.cur_row.min(self.grid.len());
                let end = at.saturating_add(n).min(self.grid.len());
                self.grid.drain(at..end);
                self.repaint(self.base + at as u64);
                if self.grid.is_empty() {
                    self.grid.push_back(Row::default());
                }
            }
            's' => self.saved = (self.cur_row, self.cur_col),
            'u' => {
                let (r, c) = self.saved;
                self.set_row(r);
                self.cur_col = c;
            }
            _ => {}
        }
    }

    fn alt_screen(&mut self, on: bool) {
        if on && self.saved_main.is_none() {
            let grid = std::mem::take(&mut self.grid);
            self.saved_main = Some((grid, self.base, self.cur_row, self.cur_col));
            self.base += self.rows as u64;
            self.grid.push_back(Row::default());
            self.cur_row = 0;
            self.cur_col = 0;
        } else if !on {
            if let Some((grid, base, r, c)) = self.saved_main.take() {
                self.commit_all();
                self.grid = grid;
                self.base = base;
                self.cur_row = r;
                self.cur_col = c;
            }
        }
    }
}

/// The first value of each CSI parameter (sub-parameters are only used by SGR).
pub(crate) struct Args {
    first: [u16; MAX_ARGS],
    len: usize,
}

const MAX_ARGS: usize = 16;

impl Args {
    fn from_vte(params: &vte::Params) -> Self {
        let mut a = Args {
            first: [0; MAX_ARGS],
            len: 0,
        };
        for p in params.iter().take(MAX_ARGS) {
            a.first[a.len] = p.first().copied().unwrap_or(0);
            a.len += 1;
        }
        a
    }

    /// Parameter `i`; `default` when missing or 0, as terminals read them.
    fn get(&self, i: usize, default: usize) -> usize {
        match self.first[..self.len].get(i) {
            None | Some(0) => default,
            Some(&n) => usize::from(n),
        }
    }
}

impl Screen {
    /// Prints a run of text exactly as vte would call [`vte::Perform::print`] for each of its
    /// characters, without the per-byte state machine.
    pub(crate) fn print_str(&mut self, text: &str) {
        let code = self.code_fg || self.faint;
        let mut col = self.cur_col;
        if text.is_empty() {
            return;
        }
        if col >= MAX_COLS {
            // As `print` does: nothing is written, and the row is marked as overflowed.
            self.row_mut().overflow = true;
            return;
        }
        let row = self.row_mut();
        let mut chars = text.chars();
        // Overwrite what is there, then append the rest in one go.
        while col < row.cells.len() {
            match chars.next() {
                Some(ch) => row.cells[col] = Cell { ch, code },
                None => {
                    self.cur_col = col;
                    return;
                }
            }
            col += 1;
        }
        if col < MAX_COLS {
            let mut rest = chars.peekable();
            if rest.peek().is_some() {
                pad_to(&mut row.cells, col);
                let room = MAX_COLS - col;
                row.cells
                    .extend(rest.by_ref().take(room).map(|ch| Cell { ch, code }));
                col = row.cells.len();
                if rest.peek().is_some() {
                    row.overflow = true;
                }
            }
        } else if chars.next().is_some() {
            row.overflow = true;
        }
        self.cur_col = col;
    }

    /// Fast path for a whole `ESC [ params final` at the start of `bytes`, params being at most
    /// 16 numbers of at most 4 digits: does exactly what vte's `csi_dispatch` would and returns
    /// the bytes used, or 0 to leave the sequence to vte. Only valid in the ground state.
    pub(crate) fn fast_csi(&mut self, bytes: &[u8]) -> usize {
        if bytes.len() < 3 || bytes[0] != 0x1b || bytes[1] != b'[' {
            return 0;
        }
        let mut a = Args {
            first: [0; MAX_ARGS],
            len: 0,
        };
        let (mut value, mut digits) = (0u16, 0);
        for (i, &b) in bytes[2..].iter().enumerate() {
            match b {
                b'0'..=b'9' if digits < 4 => {
                    value = value * 10 + u16::from(b - b'0');
                    digits += 1;
                }
                b';' if a.len < MAX_ARGS - 1 => {
                    a.first[a.len] = value;
                    a.len += 1;
                    (value, digits) = (0, 0);
                }
                0x40..=0x7e => {
                    // vte always pushes the last parameter, even an empty one.
                    a.first[a.len] = value;
                    a.len += 1;
                    self.ground = true;
                    if b == b'm' {
                        self.sgr(a.first[..a.len].iter().map(std::slice::from_ref));
                    } else {
                        self.csi(char::from(b), &a);
                    }
                    return i + 3;
                }
                _ => return 0,
            }
        }
        0
    }
}

impl vte::Perform for Screen {
    fn print(&mut self, ch: char) {
        self.ground = true;
        let col = self.cur_col;
        if col >= MAX_COLS {
            self.row_mut().overflow = true;
            return;
        }
        let cell = Cell {
            ch,
            code: self.code_fg || self.faint,
        };
        let row = self.row_mut();
        if col < row.cells.len() {
            row.cells[col] = cell;
        } else {
            pad_to(&mut row.cells, col);
            row.cells.push(cell);
        }
        self.cur_col = col + 1;
    }

    fn execute(&mut self, byte: u8) {
        match byte {
            // LF, VT, FF. Treated as CR+LF: raw captures of line-oriented output rarely rely on
            // a bare LF keeping the column, and text must not be glued to the right.
            b'\n' | 0x0b | 0x0c => {
                self.line_feed();
                self.cur_col = 0;
            }
            b'\r' => self.cur_col = 0,
            0x08 => self.cur_col = self.cur_col.saturating_sub(1),
            b'\t' => {
                let next = ((self.cur_col / 8) + 1) * 8;
                let next = next.min(MAX_COLS);
                let row = self.row_mut();
                if row.cells.len() < next {
                    pad_to(&mut row.cells, next);
                }
                self.cur_col = next;
            }
            _ => {}
        }
    }

    fn csi_dispatch(
        &mut self,
        params: &vte::Params,
        intermediates: &[u8],
        _ignore: bool,
        action: char,
    ) {
        self.ground = true;
        if let Some(&b'?') = intermediates.first() {
            if matches!(action, 'h' | 'l') {
                for p in params.iter() {
                    if matches!(p.first(), Some(1049 | 1047 | 47)) {
                        self.alt_screen(action == 'h');
                    }
                }
            }
            return;
        }
        if !intermediates.is_empty() {
            return;
        }
        if action == 'm' {
            self.sgr(params.iter());
        } else {
            self.csi(action, &Args::from_vte(params));
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], _ignore: bool, byte: u8) {
        self.ground = true;
        if !intermediates.is_empty() {
            return;
        }
        match byte {
            b'M' => self.reverse_index(),
            b'D' => self.line_feed(),
            b'E' => {
                self.line_feed();
                self.cur_col = 0;
            }
            b'7' => self.saved = (self.cur_row, self.cur_col),
            b'8' => {
                let (r, c) = self.saved;
                self.set_row(r);
                self.cur_col = c;
            }
            b'c' => {
                self.code_fg = false;
                self.faint = false;
                self.region = None;
                self.clear_all();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(bytes: &[u8]) -> Vec<String> {
        let mut s = Screen::new(DEFAULT_ROWS);
        let mut p = vte::Parser::new();
        for b in bytes {
            p.advance(&mut s, *b);
        }
        s.commit_all();
        lines(&s.out).into_iter().map(|l| l.text).collect()
    }

    fn lines(events: &[Event]) -> Vec<CommittedLine> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Line(l) => Some(l.clone()),
                Event::Repaint { .. } | Event::Clear => None,
            })
            .collect()
    }

    /// A tall screen (a pane created at 40 rows) with a prompt near its top, made shorter (a
    /// person attaches from a 25-row terminal): as in tmux, the empty rows below the cursor
    /// go, and the prompt stays where it was.
    #[test]
    fn a_shorter_screen_drops_rows_below_the_cursor_first() {
        let mut s = Screen::new(40);
        let mut p = vte::Parser::new();
        let mut bytes = b"I am Dana\r\n> ".to_vec();
        // The rest of a captured pane's rows, then the cursor put back on the prompt.
        bytes.extend(b"\r\n".repeat(38));
        bytes.extend(b"\x1b[2;3H");
        for b in &bytes {
            p.advance(&mut s, *b);
        }
        s.set_rows(24);
        let (rows, cursor_row, cursor_col) = s.visible();
        assert_eq!(rows.len(), 24);
        assert_eq!((&rows[0][..], &rows[1][..]), ("I am Dana", ">"));
        assert_eq!((cursor_row, cursor_col), (1, 2));
        // Shorter than the cursor's row: the rows above it scroll off, the cursor's row stays.
        s.set_rows(1);
        let (rows, cursor_row, _) = s.visible();
        assert_eq!((rows, cursor_row), (vec![">".to_owned()], 0));
    }

    #[test]
    fn plain_lines_and_crlf() {
        assert_eq!(run(b"one\r\ntwo\nthree"), ["one", "two", "three"]);
    }

    #[test]
    fn cursor_forward_stands_for_spaces() {
        assert_eq!(run(b"a\x1b[3Cb"), ["a   b"]);
    }

    #[test]
    fn backspace_and_carriage_return_overwrite() {
        assert_eq!(run(b"abc\x08X\rZ"), ["ZbX"]);
    }

    #[test]
    fn tabs_move_to_the_next_stop() {
        assert_eq!(run(b"a\tb"), ["a       b"]);
    }

    #[test]
    fn sgr_osc_dcs_and_private_modes_are_stripped() {
        let input = b"\x1b[1;31mred\x1b[0m \x1b]0;title\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \x1bP1$r0m\x1b\\\x1b[?25l\x1b[?2004hok";
        assert_eq!(run(input), ["red link ok"]);
    }

    #[test]
    fn cursor_up_and_erase_line_rewrite_earlier_lines() {
        let input =
            b"keep\r\nspin 1\r\nstatus\r\n\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2Kspin 2\r\nstatus\r\n";
        assert_eq!(run(input), ["keep", "spin 2", "status"]);
    }

    #[test]
    fn basic_colours_count_as_code_colour_too() {
        let mut s = Screen::new(10);
        let mut p = vte::Parser::new();
        for b in b"a\x1b[90mb\x1b[0mc\x1b[1;36md\x1b[22;39me\x1b[3mf\n" {
            p.advance(&mut s, *b);
        }
        s.commit_all();
        assert_eq!(
            lines(&s.out)[0].code,
            [false, true, false, true, false, false]
        );
    }

    /// Claude Code's detailed transcript (Ctrl+O) draws thinking faint in the default colour
    /// (`\x1b[2m...\x1b[22m`): not prose either.
    #[test]
    fn faint_text_counts_as_not_prose() {
        let mut s = Screen::new(10);
        let mut p = vte::Parser::new();
        for b in b"a\x1b[2mb\x1b[22mc\x1b[2md\x1b[0me\x1b[2;33mf\x1b[39mg\x1b[mh\n" {
            p.advance(&mut s, *b);
        }
        s.commit_all();
        assert_eq!(
            lines(&s.out)[0].code,
            [false, true, false, true, false, true, true, false]
        );
    }

    #[test]
    fn code_colour_is_recorded_per_cell() {
        let mut s = Screen::new(10);
        let mut p = vte::Parser::new();
        for b in b"ab\x1b[38;5;208mcd\x1b[39me\x1b[38:2:1:2:3mf\x1b[0m\n" {
            p.advance(&mut s, *b);
        }
        s.commit_all();
        assert_eq!(
            lines(&s.out)[0].code,
            [false, false, true, true, false, true]
        );
    }

    #[test]
    fn rows_scrolling_out_of_the_live_region_are_committed_once() {
        let mut s = Screen::new(2);
        let mut p = vte::Parser::new();
        for b in b"a\nb\nc\n" {
            p.advance(&mut s, *b);
        }
        let texts: Vec<_> = lines(&s.out)
            .iter()
            .map(|l| (l.row, l.text.clone()))
            .collect();
        assert_eq!(texts, [(0, "a".to_string()), (1, "b".to_string())]);
    }

    #[test]
    fn identical_rewrite_of_a_committed_row_is_not_committed_again() {
        let mut s = Screen::new(10);
        let mut p = vte::Parser::new();
        for b in b"same\nx" {
            p.advance(&mut s, *b);
        }
        s.commit_above_cursor();
        for b in b"\x1b[1A\rsame\n" {
            p.advance(&mut s, *b);
        }
        s.commit_above_cursor();
        assert_eq!(lines(&s.out).len(), 1);
        assert!(s.out.contains(&Event::Repaint { from_row: 0 }));
    }

    #[test]
    fn clear_screen_drops_uncommitted_rows() {
        assert_eq!(run(b"draft\x1b[2J\x1b[Hfinal"), ["final"]);
    }

    #[test]
    fn utf8_is_kept() {
        assert_eq!(run("● héllo ❯".as_bytes()), ["● héllo ❯"]);
    }

    /// Feeds `bytes` to a screen of `rows` rows and returns it, without committing.
    fn screen(rows: usize, bytes: &[u8]) -> Screen {
        let mut s = Screen::new(rows);
        let mut p = vte::Parser::new();
        for b in bytes {
            p.advance(&mut s, *b);
        }
        s
    }

    /// Codex CLI inline: history goes into a region above the input box; each line feed at the
    /// region's bottom scrolls only the region, the box below stays, and what leaves the top
    /// of the screen is final, in order.
    #[test]
    fn a_scrolling_region_scrolls_above_a_box_that_stays() {
        // Rows 1-3 are history, rows 4-5 the box ("› input", "status").
        let mut bytes = b"\x1b[4;1H\xe2\x80\xba input\x1b[5;1Hstatus".to_vec();
        for i in 1..=5 {
            bytes.extend_from_slice(format!("\x1b[1;3r\x1b[3;1H\r\nline {i}\x1b[r").as_bytes());
        }
        let mut s = screen(5, &bytes);
        let (rows, ..) = s.visible();
        assert_eq!(rows, ["line 3", "line 4", "line 5", "› input", "status"]);
        assert_eq!(
            lines(&s.out)
                .iter()
                .map(|l| &l.text[..])
                .collect::<Vec<_>>(),
            ["", "", "", "line 1", "line 2"],
            "what scrolled off the top is final"
        );
        s.out.clear();
        s.commit_all();
        let texts: Vec<String> = lines(&s.out).into_iter().map(|l| l.text).collect();
        assert_eq!(texts, ["line 3", "line 4", "line 5", "› input", "status"]);
    }

    /// Reverse index at the region's top scrolls it down: the row pushed past its bottom is
    /// gone, rows outside it stay (how Codex moves its box down before writing history).
    #[test]
    fn reverse_index_at_the_regions_top_scrolls_it_down() {
        let s = screen(5, b"a\r\nb\r\nc\r\nd\r\ne\x1b[2;4r\x1b[2;1H\x1bM\x1bMx");
        let (rows, row, col) = s.visible();
        assert_eq!(rows, ["a", "x", "", "b", "e"]);
        assert_eq!((row, col), (1, 1));
    }

    /// Inside a region, insert and delete lines move only the region's rows; outside it they
    /// do nothing. SU and SD scroll the region.
    #[test]
    fn insert_delete_and_scroll_stay_inside_the_region() {
        let base = b"a\r\nb\r\nc\r\nd\r\ne\x1b[2;4r";
        let s = screen(5, &[&base[..], b"\x1b[2;1H\x1b[L"].concat());
        assert_eq!(s.visible().0, ["a", "", "b", "c", "e"]);
        let s = screen(5, &[&base[..], b"\x1b[2;1H\x1b[M"].concat());
        assert_eq!(s.visible().0, ["a", "c", "d", "", "e"]);
        let s = screen(5, &[&base[..], b"\x1b[5;1H\x1b[L"].concat());
        assert_eq!(s.visible().0, ["a", "b", "c", "d", "e"]);
        let s = screen(5, &[&base[..], b"\x1b[2S"].concat());
        assert_eq!(s.visible().0, ["a", "d", "", "", "e"]);
        let s = screen(5, &[&base[..], b"\x1b[T"].concat());
        assert_eq!(s.visible().0, ["a", "", "b", "c", "e"]);
    }

    /// Below the region a line feed on the last row scrolls nothing; `ESC [ r` and a resize
    /// give the whole screen back.
    #[test]
    fn below_the_region_nothing_scrolls_and_the_region_can_be_reset() {
        let s = screen(3, b"a\r\nb\r\nc\x1b[1;2r\x1b[3;1H\r\nz");
        assert_eq!(s.visible().0, ["a", "b", "z"]);
        let s = screen(3, b"a\r\nb\r\nc\x1b[1;2r\x1b[r\x1b[3;1H\r\nz");
        assert_eq!(s.visible().0, ["b", "c", "z"]);
    }
}
