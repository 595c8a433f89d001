//! Replacing a small file whole: the one atomic-write helper every crate uses (the wrapper's
//! state files, the daemon's `agents.json`, the CLI's rules file, a wrapper's exit status).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a finished [`write_atomic`] survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The writing process being killed (the page cache keeps the renamed file), not a power
    /// cut. For files rewritten on a hot path, where an fsync can stall for a second on a busy
    /// disk (it once held the wrapper's relaying loop that long).
    ProcessCrash,
    /// A power cut too: the file's data is fsynced before the rename and the directory after
    /// it, so the new name cannot point at an empty file after a reboot.
    PowerLoss,
}

static NEXT_TMP: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` so that readers, and a process restarted after a crash, see the old
/// file or the new one, never a part: through a temporary file in the same directory and a
/// rename over `path`.
///
/// The file is created with mode 0600 (before the umask), so what it holds is the owner's
/// alone from its first byte; the rename keeps that mode. The temporary file is created
/// exclusively (`O_EXCL`, which also refuses a symlink planted at its name) and removed again
/// if anything fails.
///
/// # Errors
/// Any I/O error; `path` is then left as it was.
pub fn write_atomic(path: &Path, bytes: &[u8], durability: Durability) -> std::io::Result<()> {
    let tmp = tmp_name(path);
    let result = write_then_rename(&tmp, path, bytes, durability);
    if result.is_err() {
        // Best effort: the error being returned is the one that matters, and a leftover
        // temporary file is only clutter (its name is never read).
        if let Err(e) = std::fs::remove_file(&tmp)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return result.map_err(|orig| {
                std::io::Error::new(
                    orig.kind(),
                    format!("{orig} (and {} was left: {e})", tmp.display()),
                )
            });
        }
    }
    result
}

/// `<dir>/.<name>.tmp.<pid>.<n>`: in the same directory (a rename does not cross file
/// systems), unique per process and per call (two threads may write the same file), and hidden
/// from `ls`.
fn tmp_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy());
    path.with_file_name(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        NEXT_TMP.fetch_add(1, Ordering::Relaxed)
    ))
}

fn write_then_rename(
    tmp: &Path,
    path: &Path,
    bytes: &[u8],
    durability: Durability,
) -> std::io::Result<()> {
    let mut open = OpenOptions::new();
    open.write(true).create_new(true).mode(0o600);
    let mut f = match open.open(tmp) {
        // Left by an earlier process with the same pid that was killed mid-write.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(tmp)?;
            open.open(tmp)?
        }
        other => other?,
    };
    f.write_all(bytes)?;
    if durability == Durability::PowerLoss {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(tmp, path)?;
    if durability == Durability::PowerLoss {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Durability, write_atomic};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn write_atomic_replaces_the_file_private_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agents.json");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        for d in [Durability::ProcessCrash, Durability::PowerLoss] {
            write_atomic(&path, b"new", d).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"new");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{d:?}");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["agents.json"]);
    }

    #[test]
    fn a_failed_write_atomic_leaves_the_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        // A directory in the way of the rename: the write fails, `x` stays, nothing is left.
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), b"").unwrap();
        assert!(write_atomic(&path, b"new", Durability::ProcessCrash).is_err());
        assert!(path.join("keep").exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
