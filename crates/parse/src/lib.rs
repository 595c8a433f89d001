//! relay-parse: the terminal-output directive parser (in progress).
