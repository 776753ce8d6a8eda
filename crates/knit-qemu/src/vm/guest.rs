//! The guest agent: boot id, exec, files, password, name.

use super::*;

impl Machines {
    /// The guest's `/proc/sys/kernel/random/boot_id`.
    pub fn boot_id(&self, id: &str, timeout: Duration) -> Result<String> {
        let bytes = self.read_file(id, "/proc/sys/kernel/random/boot_id", 64, timeout)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// Waits until the guest agent answers (the guest has booted far
    /// enough to run commands).
    pub fn wait_agent(&self, id: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let socket = qga_socket(&self.state.vm_dir(id));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match Guest::connect(&socket, left.min(Duration::from_secs(5)))
                .and_then(|mut g| g.call("guest-ping", None))
            {
                Ok(_) => return Ok(()),
                Err(e) if left.is_zero() => {
                    return Err(QemuError::Timeout {
                        what: format!("the guest agent of {id} ({})", e.0),
                        secs: timeout.as_secs(),
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    pub(super) fn guest(&self, id: &str, timeout: Duration) -> Result<Guest> {
        let vm = self.describe(id)?;
        if !vm.alive {
            return Err(QemuError::WrongState {
                what: format!("VM {id}"),
                message: "is not running".into(),
            });
        }
        Guest::connect(&qga_socket(&vm.dir), timeout).map_err(|e| QemuError::Agent {
            id: id.to_string(),
            message: e.0,
        })
    }

    /// Runs `argv` inside through qemu-guest-agent: exit code and output
    /// (each at most [`agent::EXEC_MAX_OUTPUT`]); killed inside after
    /// `timeout`.
    pub fn exec(&self, id: &str, argv: &[String], timeout: Duration) -> Result<ExecOutput> {
        if argv.is_empty() || argv[0].is_empty() {
            return Err(QemuError::invalid("argv", "[]", "must name a command"));
        }
        let mut g = self.guest(id, timeout)?;
        g.exec(argv, None).map_err(|e| QemuError::Agent {
            id: id.to_string(),
            message: format!("{}: {}", argv[0], e.0),
        })
    }

    /// A file from inside, refused when larger than `max_bytes`.
    pub fn read_file(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let mut g = self.guest(id, timeout)?;
        g.read_file(path, max_bytes).map_err(|e| QemuError::Agent {
            id: id.to_string(),
            message: e.0,
        })
    }

    /// Root's password, set by the guest agent (guest-set-user-password).
    /// The password goes only over the VM's socket: never into argv, a
    /// record, a log or an error.
    pub fn set_password(&self, id: &str, password: &str) -> Result<()> {
        if password.is_empty() || password.len() > 256 || password.contains(['\n', '\r', '\0', ':'])
        {
            return Err(QemuError::invalid(
                "password",
                format!("({} characters)", password.chars().count()),
                "must be 1 to 256 bytes without newline, NUL or ':'",
            ));
        }
        let mut g = self.guest(id, Duration::from_secs(60))?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(password);
        g.call(
            "guest-set-user-password",
            Some(json!({"username": "root", "password": b64, "crypted": false})),
        )
        .map_err(|e| QemuError::Agent {
            id: id.to_string(),
            // qemu-ga's message never holds the password (it is sent base64 to chpasswd's stdin).
            message: e.0,
        })?;
        let _lock = self.state.lock()?;
        let mut rec = self.state.vm(id)?;
        rec.password_set_at = Some(now_secs());
        self.state.put_vm(&rec)
    }

    /// New name and hostname: in the record and the seed's meta-data (the
    /// next boot's cloud-init), and at once inside a running guest.
    pub fn rename(&self, id: &str, name: &str) -> Result<Vm> {
        valid_name(name)?;
        let rec = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.vm(id)?;
            rec.name = name.to_string();
            rec.hostname = name.to_string();
            self.state.put_vm(&rec)?;
            rec
        };
        self.write_seed(&rec, None)?;
        let vm = self.view(rec);
        if vm.alive {
            let script = knit_local::shell::guest_hostname(
                name,
                None,
                knit_local::shell::LiveHostname::Required,
            )
            .map_err(|e| QemuError::invalid("name", format!("{name:?}"), e.rule))?;
            let argv = vec!["sh".to_string(), "-c".to_string(), script];
            let out = self.exec(id, &argv, Duration::from_secs(60))?;
            if out.code != 0 {
                return Err(QemuError::Agent {
                    id: id.to_string(),
                    message: format!(
                        "setting the hostname: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
        }
        Ok(vm)
    }
}

/// `systemctl VERB` two seconds after it returns, so the guest agent
/// answers first.
pub(super) const DETACHED_SYSTEMCTL: &str = include_str!("../scripts/detached-systemctl.sh");

/// The guest-agent argv running [`DETACHED_SYSTEMCTL`] for `verb`.
pub(super) fn detached_systemctl(verb: &str) -> Result<Vec<String>> {
    let script = knit_local::shell::render(DETACHED_SYSTEMCTL, &[("verb", verb)], &[])
        .map_err(|e| QemuError::invalid("verb", format!("{verb:?}"), e.rule))?;
    Ok(vec!["sh".to_string(), "-c".to_string(), script])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The detached systemctl script runs with the verb as it is: stand-in
    /// `sleep` and `systemctl` in a scratch PATH record what they got.
    #[test]
    fn detached_systemctl_passes_the_verb_unchanged() {
        use std::os::unix::fs::PermissionsExt;
        for verb in ["reboot", "it's $HOME `x` $(y)", "a b\nc"] {
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("systemctl.log");
            for (tool, body) in [
                ("sleep", "exit 0".to_string()),
                (
                    "systemctl",
                    format!(
                        "printf '%s|' \"$@\" > {}.tmp && mv {0}.tmp {0}",
                        knit_local::shell::quote(&log.display().to_string())
                    ),
                ),
            ] {
                let p = dir.path().join(tool);
                std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let argv = detached_systemctl(verb).unwrap();
            assert_eq!(argv[..2], ["sh", "-c"]);
            let status = std::process::Command::new("/bin/sh")
                .args(&argv[1..])
                .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
                .status()
                .unwrap();
            assert!(status.success());
            // Detached: its stand-in systemctl writes a moment later.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !log.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(std::fs::read_to_string(&log).unwrap(), format!("{verb}|"));
        }
        assert!(detached_systemctl("a\0b").is_err());
    }
}
