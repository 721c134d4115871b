//! What the guest writes to the user's terminal: control sequences made visible.
//!
//! A guest that shares the user's terminal could clear the screen, set the window title,
//! write the clipboard (OSC 52), move the cursor over earlier output, or hide text. When
//! stderr is a terminal (and `--raw` is not given) every control byte but tab, newline and
//! carriage return is shown in caret notation (`ESC` becomes `^[`), and the C1 controls
//! (U+0080–U+009F as UTF-8, which some terminals obey like `ESC` sequences) as `\u{XX}`. Into a pipe or
//! a file the bytes pass unchanged.

use std::io::{self, Write};

/// A writer that neutralises control sequences before they reach `inner`.
pub(crate) struct Neutral<W> {
    inner: W,
    /// A 0xC2 lead byte seen at the end of the last write (the start of a C1 control in UTF-8).
    pending_c2: bool,
}

impl<W: Write> Neutral<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self { inner, pending_c2: false }
    }
}

/// Appends the visible form of `bytes` to `out`; returns whether a trailing 0xC2 is pending.
pub(crate) fn neutralise(bytes: &[u8], mut pending_c2: bool, out: &mut Vec<u8>) -> bool {
    for &b in bytes {
        if pending_c2 {
            pending_c2 = false;
            if (0x80..=0x9f).contains(&b) {
                out.extend_from_slice(format!("\\u{{{b:02x}}}").as_bytes());
                continue;
            }
            out.push(0xc2);
        }
        match b {
            b'\t' | b'\n' | b'\r' => out.push(b),
            0x00..=0x1f => out.extend_from_slice(&[b'^', b + 0x40]),
            0x7f => out.extend_from_slice(b"^?"),
            0xc2 => pending_c2 = true,
            // Other bytes pass: 0x80–0xBF are also UTF-8 continuation bytes, and a terminal
            // in UTF-8 mode does not read a lone 0x9B as an 8-bit CSI.
            _ => out.push(b),
        }
    }
    pending_c2
}

impl<W: Write> Write for Neutral<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len() + 8);
        self.pending_c2 = neutralise(buf, self.pending_c2, &mut out);
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// One line of outside text (a host MCP server's stderr, a model's or a tool's words in a
/// step line) as stockade shows it, wherever stderr goes: newlines and carriage returns as
/// `\n` and `\r`, every other control byte in caret notation and the C1 controls as
/// `\u{XX}` ([`neutralise`]). The one rule for outside text in stockade's own lines.
pub(crate) fn outside_line(text: &str) -> String {
    outside_text(&text.replace('\n', "\\n").replace('\r', "\\r"))
}

/// Outside text of several lines (a model's answer, an error that quotes a tool or a
/// sandbox) as stockade shows it: its newlines kept (a CRLF as a newline), every other
/// control, a lone carriage return included, made visible as [`outside_line`] does.
pub(crate) fn outside_text(text: &str) -> String {
    // A lone carriage return would let the text overwrite the line it is shown on.
    let text = text.replace("\r\n", "\n").replace('\r', "\\r");
    let mut out = Vec::with_capacity(text.len());
    let pending = neutralise(text.as_bytes(), false, &mut out);
    if pending {
        out.extend_from_slice(b"\\u{c2}");
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Most log lines waiting for stderr ([`log_line`]); past it, lines are dropped and counted.
const MAX_QUEUED_LINES: usize = 1024;

/// The owner's stderr log: lines are queued (at most [`MAX_QUEUED_LINES`]) and written by a
/// thread of their own, so a slow stderr (a pipe nobody reads, a paused terminal) never
/// blocks the async worker that logged, and a guest that makes lines at will (one per
/// denied connection) fills a bounded queue, not memory. Dropped lines are counted and the
/// count is written once stderr takes lines again.
struct Log {
    tx: std::sync::mpsc::SyncSender<String>,
    dropped: std::sync::atomic::AtomicU64,
    // Lines queued and not yet written.
    pending: std::sync::atomic::AtomicUsize,
}

static LOG_STARTED: std::sync::OnceLock<Log> = std::sync::OnceLock::new();

fn log() -> &'static Log {
    LOG_STARTED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(MAX_QUEUED_LINES);
        // Without a thread (none could be made), the queue fills and lines are dropped and
        // counted, never written from a worker.
        let _ = std::thread::Builder::new().name("stockade-log".into()).spawn(move || {
            for line in rx {
                let mut err = io::stderr().lock();
                let dropped = log().dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
                if dropped > 0 {
                    let _ = writeln!(err, "stockade: {dropped} log lines were dropped (stderr was slow)");
                }
                let _ = writeln!(err, "{line}");
                log().pending.fetch_sub(1, std::sync::atomic::Ordering::Release);
            }
        });
        Log { tx, dropped: std::sync::atomic::AtomicU64::new(0), pending: std::sync::atomic::AtomicUsize::new(0) }
    })
}

/// Writes `line` to stderr without ever waiting for it (see [`Log`]).
pub(crate) fn log_line(line: String) {
    let log = log();
    log.pending.fetch_add(1, std::sync::atomic::Ordering::Acquire);
    if log.tx.try_send(line).is_err() {
        log.pending.fetch_sub(1, std::sync::atomic::Ordering::Release);
        log.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Waits, at most `within`, until every queued log line is written (a process about to
/// exit; never called from an async worker).
pub(crate) fn flush_log(within: std::time::Duration) {
    let Some(log) = LOG_STARTED.get() else { return };
    let until = std::time::Instant::now() + within;
    while log.pending.load(std::sync::atomic::Ordering::Acquire) > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on broken invariants")]
mod tests {
    use super::*;

    fn show(b: &[u8]) -> String {
        let mut out = Vec::new();
        let pending = neutralise(b, false, &mut out);
        assert!(!pending);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn control_sequences_become_visible_and_text_passes() {
        assert_eq!(show(b"\x1b[2J\x1b[Hhi"), "^[[2J^[[Hhi");
        assert_eq!(show(b"\x1b]52;c;aGk=\x07"), "^[]52;c;aGk=^G");
        assert_eq!(show(b"\x1b]0;title\x1b\\"), "^[]0;title^[\\");
        assert_eq!(show("tab\there\r\nüñ €\n".as_bytes()), "tab\there\r\nüñ €\n");
        assert_eq!(show("\u{9b}2J".as_bytes()), "\\u{9b}2J");
        assert_eq!(show(b"\x7f"), "^?");
    }

    #[test]
    fn a_c1_control_split_across_writes_is_caught() {
        let mut w = Neutral::new(Vec::new());
        w.write_all(b"a\xc2").unwrap();
        w.write_all(b"\x9bb \xc2").unwrap();
        w.write_all(b"\xa9").unwrap();
        assert_eq!(String::from_utf8(w.inner).unwrap(), "a\\u{9b}b ©");
    }

    #[test]
    fn outside_text_is_shown_by_one_rule_in_a_line_or_in_text() {
        let hostile = "a\u{1b}[2J\u{1b}]52;c;eA==\u{7}b\u{9b}c\r\nnext";
        assert_eq!(outside_line(hostile), "a^[[2J^[]52;c;eA==^Gb\\u{9b}c\\r\\nnext");
        assert_eq!(outside_text(hostile), "a^[[2J^[]52;c;eA==^Gb\\u{9b}c\nnext");
        assert_eq!(outside_text("ok\rDENIED hidden"), "ok\\rDENIED hidden");
        assert_eq!(outside_line("plain words\ttab"), "plain words\ttab");
    }
}
