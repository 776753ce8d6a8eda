//! The two sockets of a VM: QMP (QEMU's monitor: power button, reset,
//! quit) and qemu-guest-agent over virtio-serial (exec, files, password).
//! Both speak one JSON object per line; every read and write has a
//! deadline and every reply a size cap.

use base64::Engine;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest reply line accepted (a 16 MiB exec output is ~22 MiB of base64).
const MAX_LINE: usize = 32 << 20;
/// Largest output one exec returns (stdout and stderr each); qemu-ga
/// itself keeps at most 16 MiB.
pub const EXEC_MAX_OUTPUT: usize = 16 << 20;
/// What one guest-file-read asks for.
const READ_CHUNK: usize = 1 << 20;

/// A failure talking to a socket: the message only (the caller names the VM).
#[derive(Debug)]
pub struct SocketError(pub String);

type Res<T> = std::result::Result<T, SocketError>;

fn fail<T>(m: impl Into<String>) -> Res<T> {
    Err(SocketError(m.into()))
}

struct Channel {
    reader: BufReader<UnixStream>,
    deadline: Instant,
}

impl Channel {
    fn connect(path: &Path, deadline: Instant) -> Res<Channel> {
        let stream = UnixStream::connect(path)
            .or_else(|e| fail(format!("cannot connect to {}: {e}", path.display())))?;
        let ch = Channel {
            reader: BufReader::new(stream),
            deadline,
        };
        ch.arm()?;
        Ok(ch)
    }

    /// Sets the socket's timeouts to what is left before the deadline.
    fn arm(&self) -> Res<()> {
        let left = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| SocketError("no answer before the deadline".into()))?;
        let s = self.reader.get_ref();
        s.set_read_timeout(Some(left))
            .and_then(|_| s.set_write_timeout(Some(left)))
            .or_else(|e| fail(format!("socket timeouts: {e}")))
    }

    fn send(&mut self, v: &Value) -> Res<()> {
        self.arm()?;
        let mut line = v.to_string();
        line.push('\n');
        self.reader
            .get_mut()
            .write_all(line.as_bytes())
            .or_else(|e| fail(format!("write: {e}")))
    }

    /// One line (without the newline), at most [`MAX_LINE`] bytes.
    fn line(&mut self) -> Res<Vec<u8>> {
        let mut buf = Vec::new();
        loop {
            self.arm()?;
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return fail("no answer before the deadline")
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return fail(format!("read: {e}")),
            };
            if chunk.is_empty() {
                return fail("connection closed");
            }
            if let Some(i) = chunk.iter().position(|b| *b == b'\n') {
                buf.extend_from_slice(&chunk[..i]);
                self.reader.consume(i + 1);
                return Ok(buf);
            }
            let n = chunk.len();
            buf.extend_from_slice(chunk);
            self.reader.consume(n);
            if buf.len() > MAX_LINE {
                return fail(format!("reply longer than {MAX_LINE} bytes"));
            }
        }
    }

    /// The next JSON object that is not an asynchronous event.
    fn reply(&mut self) -> Res<Value> {
        loop {
            let line = self.line()?;
            // qemu-ga answers guest-sync-delimited after a 0xFF byte.
            let text: Vec<u8> = line.into_iter().filter(|b| *b != 0xff).collect();
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let v: Value = serde_json::from_slice(&text)
                .or_else(|e| fail(format!("unreadable reply: {e}")))?;
            if v.get("event").is_some() {
                continue;
            }
            return Ok(v);
        }
    }

    fn call(&mut self, command: &str, arguments: Option<Value>) -> Res<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        self.send(&msg)?;
        returned(self.reply()?, command)
    }
}

fn returned(v: Value, command: &str) -> Res<Value> {
    if let Some(r) = v.get("return") {
        return Ok(r.clone());
    }
    if let Some(e) = v.get("error") {
        let desc = e.get("desc").and_then(Value::as_str).unwrap_or("unknown");
        return fail(format!("{command}: {desc}"));
    }
    fail(format!("{command}: unexpected reply"))
}

/// One QMP command on `socket` (greeting and capabilities negotiated
/// first).
pub fn qmp(
    socket: &Path,
    command: &str,
    arguments: Option<Value>,
    timeout: Duration,
) -> Res<Value> {
    let mut ch = Channel::connect(socket, Instant::now() + timeout)?;
    let greeting = ch.reply()?;
    if greeting.get("QMP").is_none() {
        return fail("no QMP greeting");
    }
    ch.call("qmp_capabilities", None)?;
    ch.call(command, arguments)
}

/// A session with qemu-guest-agent: synchronised first, so a stale reply
/// left by an earlier, timed-out caller is skipped.
pub struct Guest {
    ch: Channel,
}

impl Guest {
    pub fn connect(socket: &Path, timeout: Duration) -> Res<Guest> {
        let mut ch = Channel::connect(socket, Instant::now() + timeout)?;
        let id = u32::from_ne_bytes(rand4()) as u64 & 0x7fff_ffff;
        ch.send(&json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}))?;
        loop {
            let v = ch.reply()?;
            if v.get("return").and_then(Value::as_u64) == Some(id) {
                break;
            }
        }
        Ok(Guest { ch })
    }

    pub fn call(&mut self, command: &str, arguments: Option<Value>) -> Res<Value> {
        self.ch.call(command, arguments)
    }

    /// Runs `argv` (argv[0] looked up on the guest agent's PATH) and waits
    /// for it until the session's deadline; on timeout it is killed inside.
    pub fn exec(&mut self, argv: &[String], stdin: Option<&[u8]>) -> Res<ExecOutput> {
        let Some((path, args)) = argv.split_first() else {
            return fail("empty command");
        };
        let mut a = json!({"path": path, "arg": args, "capture-output": true});
        if let Some(input) = stdin {
            a["input-data"] = json!(base64::engine::general_purpose::STANDARD.encode(input));
        }
        let pid = self
            .call("guest-exec", Some(a))?
            .get("pid")
            .and_then(Value::as_i64)
            .ok_or_else(|| SocketError("guest-exec: no pid".into()))?;
        let mut pause = Duration::from_millis(20);
        loop {
            let status = match self.call("guest-exec-status", Some(json!({"pid": pid}))) {
                Ok(s) => s,
                Err(e) => {
                    // Out of time (or the agent went away): do not leave it running.
                    let _ = self.kill_after_timeout(pid);
                    return Err(e);
                }
            };
            if status.get("exited").and_then(Value::as_bool) == Some(true) {
                let decode = |key: &str| -> Vec<u8> {
                    let mut bytes = status
                        .get(key)
                        .and_then(Value::as_str)
                        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                        .unwrap_or_default();
                    bytes.truncate(EXEC_MAX_OUTPUT);
                    bytes
                };
                let code = status
                    .get("exitcode")
                    .and_then(Value::as_i64)
                    .map(|c| c as i32)
                    .or_else(|| {
                        status
                            .get("signal")
                            .and_then(Value::as_i64)
                            .map(|s| 128 + s as i32)
                    })
                    .unwrap_or(-1);
                return Ok(ExecOutput {
                    code,
                    stdout: decode("out-data"),
                    stderr: decode("err-data"),
                    truncated: status.get("out-truncated").and_then(Value::as_bool) == Some(true)
                        || status.get("err-truncated").and_then(Value::as_bool) == Some(true),
                });
            }
            if self.ch.deadline.saturating_duration_since(Instant::now()) < pause {
                let _ = self.kill_after_timeout(pid);
                return fail("the command did not finish before the deadline (killed)");
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// A short extra deadline to kill a command whose own ran out.
    fn kill_after_timeout(&mut self, pid: i64) -> Res<()> {
        self.ch.deadline = Instant::now() + Duration::from_secs(5);
        let argv =
            json!({"path": "kill", "arg": ["-KILL", pid.to_string()], "capture-output": false});
        self.call("guest-exec", Some(argv)).map(|_| ())
    }

    /// A file's bytes, refused when longer than `max_bytes`.
    pub fn read_file(&mut self, path: &str, max_bytes: usize) -> Res<Vec<u8>> {
        let handle = self
            .call("guest-file-open", Some(json!({"path": path, "mode": "r"})))?
            .as_i64()
            .ok_or_else(|| SocketError("guest-file-open: no handle".into()))?;
        let result = (|| {
            let mut out = Vec::new();
            loop {
                let r = self.call(
                    "guest-file-read",
                    Some(json!({"handle": handle, "count": READ_CHUNK})),
                )?;
                if let Some(b) = r.get("buf-b64").and_then(Value::as_str) {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .or_else(|e| fail(format!("guest-file-read: {e}")))?;
                    out.extend_from_slice(&bytes);
                }
                if out.len() > max_bytes {
                    return fail(format!("{path} is larger than {max_bytes} bytes"));
                }
                if r.get("eof").and_then(Value::as_bool) == Some(true) {
                    return Ok(out);
                }
            }
        })();
        let _ = self.call("guest-file-close", Some(json!({"handle": handle})));
        result
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// qemu-ga kept only part of the output.
    pub truncated: bool,
}

fn rand4() -> [u8; 4] {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    b
}
