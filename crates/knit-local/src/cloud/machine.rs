//! One machine's life: create, boot, halt, start, stop, reboot, reimage,
//! delete; commands run in it, its user data, its name and password.

use super::*;

impl Cloud {
    // ---- create ----------------------------------------------------------

    pub fn create(&self, tpl: &Template) -> Result<Instance> {
        tpl.validate()?;
        self.check_snapshots(&tpl.disks)?;
        // The instance keeps the image it was made from: a link such as
        // the images directory's `debian-12` moves with the next build.
        let mut resolved = tpl.clone();
        resolved.base_root = resolve_base_root(&tpl.base_root);
        let tpl = &resolved;
        let os = tpl
            .attributes
            .os
            .clone()
            .unwrap_or_else(|| OsInfo::from_root(&tpl.base_root));

        let mut rec = {
            let _lock = self.state.lock()?;
            // Read once for every check below: each record is a file, and a
            // read of all of them per check made every create slower by
            // the number of machines (five reads of 1,000 files at 1,000).
            let records = self.state.instances()?;
            if let Some(existing) = by_client_token(&records, tpl.client_token.as_deref()) {
                tracing::info!(id = %existing.id, "create repeated with the same client token: the instance it made");
                return self.view(existing);
            }
            self.check_capacity(&records, &tpl.instance_type)?;
            self.check_host_limits(&records, tpl)?;
            self.ensure_network()?;
            let id = new_id("i-")?;
            let ip = self.pick_ip(&records, tpl.private_ip.as_deref())?;
            let o = ip.octets();
            let mut rec = InstanceRecord {
                hostname: tpl
                    .hostname
                    .clone()
                    .or_else(|| tpl.name.clone())
                    .unwrap_or_else(|| id.clone()),
                state: InstanceState::Creating,
                template: redacted(tpl),
                os,
                private_ip: ip.to_string(),
                mac: format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]),
                veth: format!("kv{}", &id[2..]),
                netns: format!("knit-{id}"),
                bridge: None,
                system_disk_size: tpl.system_disk_size.bytes().unwrap_or(0),
                disks: Vec::new(),
                init: None,
                shim: None,
                created_at: now(),
                boots: 0,
                last_boot_ms: None,
                password_set_at: None,
                cgroups: Vec::new(),
                id,
            };
            self.state.put_instance(&rec)?;
            let mut used = BTreeSet::new();
            for d in &tpl.disks {
                let disk = self.new_disk_record(d, Some((&rec.id, &mut used)))?;
                self.state.put_disk(&disk)?;
                rec.disks.push(disk.id);
            }
            self.state.put_instance(&rec)?;
            rec
        };
        crate::pause::checkpoint("record");
        let made = self.make_disks(&rec, tpl).and_then(|_| {
            crate::pause::checkpoint("disks");
            self.boot(&mut rec)
        });
        if let Err(e) = made {
            if let Err(undo) = self.destroy(&rec.id) {
                tracing::warn!(id = %rec.id, error = %undo, "rollback of a failed create left something; `down` will release it");
            }
            return Err(e);
        }
        self.view(rec)
    }

    // ---- boot / halt -------------------------------------------------------

    pub(super) fn boot(&self, rec: &mut InstanceRecord) -> Result<()> {
        let size = crate::bounds::Size::of(&rec.template.instance_type)?;
        // Its port's bridge is chosen (and made) under the lock, so that
        // two boots never take the last port of one bridge.
        let (n, master) = {
            let _lock = self.state.lock()?;
            let mut n = self.ensure_network()?;
            let master = self.place_port(rec, &mut n)?;
            (n, master)
        };
        let system_disk = loopdev::attach(&self.state.system_disk_file(&rec.id))?;
        let mut disks: Vec<BootDisk> = Vec::new();
        let mut devs = vec![crate::bounds::Dev {
            major: system_disk.major,
            minor: system_disk.minor,
        }];
        for id in &rec.disks {
            let d = self.state.disk(id)?;
            let dev = loopdev::attach(&self.state.disk_file(id))?;
            devs.push(crate::bounds::Dev {
                major: dev.major,
                minor: dev.minor,
            });
            disks.push(BootDisk::new(&dev, &d));
        }
        crate::pause::checkpoint("loops");
        // Its cgroups: recorded, then made (size, device allow-list).
        rec.cgroups = crate::bounds::plan(&rec.id)?;
        {
            let _lock = self.state.lock()?;
            // Not written back when deleted meanwhile (see the end of boot).
            self.state.instance(&rec.id)?;
            self.state.put_instance(rec)?;
        }
        crate::bounds::create(&rec.cgroups, &size, &devs)?;
        let entry = crate::bounds::Entry::new(&rec.cgroups)?;
        crate::pause::checkpoint("cgroups");
        net::netns_add(&rec.netns)?;
        let ip = rec.private_ip.parse().map_err(|_| LocalError::State {
            path: self.state.instance_dir(&rec.id),
            message: format!("bad privateIp {}", rec.private_ip),
        })?;
        Veth {
            host: &rec.veth,
            netns: &rec.netns,
            bridge: &n.bridge,
            master: &master,
            mac: &rec.mac,
            ip,
            prefix: self.subnet.prefix,
            gateway: self.gateway()?,
        }
        .create()?;
        if let Some(mbit) = rec.template.bandwidth_mbit {
            net::shape(&rec.veth, &rec.netns, Some(mbit))?;
        }
        crate::pause::checkpoint("network");

        let dir = self.state.instance_dir(&rec.id);
        let spec = BootSpec {
            id: rec.id.clone(),
            hostname: rec.hostname.clone(),
            private_ip: rec.private_ip.clone(),
            base_root: rec.template.base_root.clone(),
            instance_dir: dir.clone(),
            hide: vec![self.state.root().to_path_buf()],
            system_disk,
            disks,
            user_data: rec.template.user_data.clone(),
            runner: rec.template.user_data_runner,
            os_override: rec.template.attributes.os.clone(),
            swap: rec.template.attributes.swap,
        };
        let spec_path = dir.join("boot.json");
        state::write_json(&spec_path, &spec)?;
        let console = dir.join("console.log");
        let console_file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&console)
            .ctx("cannot open", &console)?;
        let netns = std::fs::File::open(net::netns_path(&rec.netns))
            .ctx("cannot open", net::netns_path(&rec.netns))?;
        let netns_fd = netns.as_raw_fd();
        let mut cmd = Command::new(self.helper()?);
        cmd.arg("__boot")
            .arg(&spec_path)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(console_file);
        // PID 1 and its shim are never the out-of-memory victim (the user-data
        // runner sets its own score back to 0).
        let oom_adj = c"/proc/self/oom_score_adj";
        // SAFETY: only raw syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Its cgroups first: the new cgroup namespace is rooted there.
                entry.join()?;
                if libc::setns(netns_fd, libc::CLONE_NEWNET) != 0
                    || libc::unshare(
                        libc::CLONE_NEWUTS
                            | libc::CLONE_NEWIPC
                            | libc::CLONE_NEWPID
                            | libc::CLONE_NEWCGROUP,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                let fd = libc::open(oom_adj.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"-1000".as_ptr().cast(), 5);
                    libc::close(fd);
                }
                // Last: the bounding set and the seccomp filter bind the
                // machine's first process from its exec on.
                entry.confine()
            });
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .ctx("cannot start instance init", self.helper()?)?;
        drop(netns);
        rec.shim = ProcRef::of(child.id() as i32);
        let stdout = child.stdout.take();
        // Reap the shim whenever it ends, success or not: no zombies in a
        // long-lived caller (one thread reaps every machine's).
        knit_os::reap::when_done(child);
        let (tx, rx) = mpsc::channel::<Option<String>>();
        std::thread::spawn(move || {
            if let Some(out) = stdout {
                for line in std::io::BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(Some(line)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(None);
        });
        let fail = |message: String| LocalError::Boot {
            id: rec.id.clone(),
            message: format!("{message} (console: {})", console.display()),
        };
        let pid =
            init_handshake(|| rx.recv_timeout(BOOT_TIMEOUT.saturating_sub(started.elapsed())))
                .map_err(&fail)?;
        let init = ProcRef::of(pid)
            .ok_or_else(|| fail(format!("init (pid {pid}) ended right after it was ready")))?;
        rec.init = Some(init);
        rec.state = InstanceState::Running;
        rec.boots += 1;
        rec.last_boot_ms = Some(started.elapsed().as_millis() as u64);
        {
            let _lock = self.state.lock()?;
            // Released meanwhile by another process (a create that was
            // frozen, then its instance deleted by the next leader): the
            // record is not written back, what this boot started ends.
            if self.state.instance(&rec.id).is_err() {
                drop(_lock);
                if let Err(e) = self.halt(rec) {
                    tracing::warn!(id = %rec.id, error = %e, "ending a boot whose instance was deleted meanwhile");
                }
                return Err(LocalError::NotFound {
                    kind: "instance",
                    id: rec.id.clone(),
                });
            }
            self.state.put_instance(rec)?;
        }
        tracing::info!(id = %rec.id, ip = %rec.private_ip, boot_ms = rec.last_boot_ms, "instance ready");
        crate::pause::checkpoint("spawn");
        Ok(())
    }

    /// Ends every process of the instance and releases its network and loop
    /// devices; the files (disks, system layer) stay.
    pub(super) fn halt(&self, rec: &mut InstanceRecord) -> Result<usize> {
        if let Some(init) = rec.init.filter(|i| i.alive()) {
            let _ = kill(Pid::from_raw(init.pid), Signal::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while init.alive() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Whatever is still in the instance's network namespace is ours.
        let mut killed = BTreeSet::new();
        kill_until_empty(|| net::pids_in_netns(&rec.netns), &mut killed);
        // In case the namespace's name was removed behind our back.
        for p in [rec.init, rec.shim]
            .into_iter()
            .flatten()
            .filter(|p| p.alive())
        {
            if kill(Pid::from_raw(p.pid), Signal::SIGKILL).is_ok() {
                killed.insert(p.pid);
            }
        }
        // A process that left the network namespace is still in the cgroup.
        kill_until_empty(|| crate::bounds::pids(&rec.cgroups), &mut killed);
        crate::bounds::remove(&rec.cgroups)?;
        rec.cgroups.clear();
        match rec.private_ip.parse() {
            Ok(ip) => net::delete_veth(&net::Guard {
                bridge: &self.cfg.bridge,
                port: &rec.veth,
                mac: &rec.mac,
                ip,
            })?,
            // No guard can have been made with it; `down` removes the table.
            Err(_) => net::delete_link(&rec.veth)?,
        }
        net::netns_del(&rec.netns)?;
        // Its port is free: the bridge may go when empty (`release_bridges`).
        rec.bridge = None;
        loopdev::detach_file(&self.state.system_disk_file(&rec.id))?;
        for id in &rec.disks {
            loopdev::detach_file(&self.state.disk_file(id))?;
        }
        rec.init = None;
        rec.shim = None;
        Ok(killed.len())
    }

    // ---- lifecycle ---------------------------------------------------------

    pub(super) fn running(&self, id: &str, action: &'static str) -> Result<InstanceRecord> {
        let rec = self.state.instance(id)?;
        if rec.state != InstanceState::Running || !rec.init.is_some_and(|i| i.alive()) {
            return Err(LocalError::WrongState {
                id: id.into(),
                state: if rec.state == InstanceState::Running {
                    "running (but its init is gone)".into()
                } else {
                    rec.state.to_string()
                },
                action,
                wanted: "running",
            });
        }
        Ok(rec)
    }

    pub fn start(&self, id: &str) -> Result<Instance> {
        let mut rec = self.state.instance(id)?;
        if rec.init.is_some_and(|i| i.alive()) {
            return Err(LocalError::WrongState {
                id: id.into(),
                state: rec.state.to_string(),
                action: "start",
                wanted: "stopped",
            });
        }
        // Leftovers of an instance whose init died on its own.
        self.halt(&mut rec)?;
        if let Err(e) = self.boot(&mut rec) {
            if let Err(undo) = self.halt(&mut rec) {
                tracing::warn!(id = %rec.id, error = %undo, "cleanup after a failed start");
            }
            rec.state = InstanceState::Stopped;
            if let Err(undo) = self.state.put_instance(&rec) {
                tracing::warn!(id = %rec.id, error = %undo, "cannot record the instance as stopped");
            }
            self.release_bridges();
            return Err(e);
        }
        self.view(rec)
    }

    pub fn stop(&self, id: &str) -> Result<Instance> {
        let mut rec = self.state.instance(id)?;
        if rec.state == InstanceState::Stopped {
            return Err(LocalError::WrongState {
                id: id.into(),
                state: rec.state.to_string(),
                action: "stop",
                wanted: "running",
            });
        }
        self.halt(&mut rec)?;
        rec.state = InstanceState::Stopped;
        self.state.put_instance(&rec)?;
        self.release_bridges();
        tracing::info!(id = %rec.id, "instance stopped");
        self.view(rec)
    }

    pub fn reboot(&self, id: &str) -> Result<Instance> {
        self.running(id, "reboot")?;
        self.stop(id)?;
        self.start(id)
    }

    /// New system layer from the base root, data disks kept under new ids,
    /// new user data (when given); the instance is booted afterwards.
    pub fn reimage(&self, id: &str, user_data: Option<String>) -> Result<Instance> {
        self.reimage_from(id, user_data, None)
    }

    /// `reimage` onto another image: the new system layer lies over
    /// `base_root` (an image directory, or `/` for the host's root) instead
    /// of the instance's current one. The image is checked before the
    /// instance is stopped; its os-release becomes the instance's OS unless
    /// the `os` attribute overrides it.
    pub fn reimage_from(
        &self,
        id: &str,
        user_data: Option<String>,
        base_root: Option<&Path>,
    ) -> Result<Instance> {
        let mut rec = self.state.instance(id)?;
        let base_root = base_root.map(resolve_base_root);
        let base_root = base_root.as_deref();
        if let Some(root) = base_root {
            // The whole recorded template against the new root: baseRoot's
            // rule, and cloud-init present when that runner is used.
            let mut t = rec.template.clone();
            t.base_root = root.to_path_buf();
            t.validate()?;
        }
        self.halt(&mut rec)?;
        rec.state = InstanceState::Stopped;
        if user_data.is_some() {
            rec.template.user_data = user_data;
        }
        if let Some(root) = base_root {
            rec.template.base_root = root.to_path_buf();
            rec.os = rec
                .template
                .attributes
                .os
                .clone()
                .unwrap_or_else(|| OsInfo::from_root(root));
        }
        // The new system layer has the image's /etc/shadow: a password set
        // before is gone with the old one.
        rec.password_set_at = None;
        self.state.put_instance(&rec)?;
        self.make_system_disk(&rec)?;
        let mut renamed = Vec::new();
        for old in &rec.disks {
            let mut d = self.state.disk(old)?;
            let new = new_id("d-")?;
            std::fs::rename(self.state.disk_dir(old), self.state.disk_dir(&new))
                .ctx("cannot rename", self.state.disk_dir(old))?;
            d.serial = new[2..].to_string();
            d.id = new.clone();
            self.state.put_disk(&d)?;
            renamed.push(new);
        }
        rec.disks = renamed;
        self.state.put_instance(&rec)?;
        self.start(id)
    }

    pub fn delete(&self, id: &str) -> Result<()> {
        self.state.instance(id)?;
        self.destroy(id).map(|_| ())
    }

    /// Releases everything of an instance, whatever its state.
    pub(super) fn destroy(&self, id: &str) -> Result<usize> {
        let mut rec = self.state.instance(id)?;
        let killed = self.halt(&mut rec)?;
        for d in &rec.disks {
            self.remove_with_file(&self.state.disk_dir(d), &self.state.disk_file(d))?;
        }
        state::remove_dir_all(&self.state.instance_dir(id))?;
        self.release_bridges();
        tracing::info!(id, killed, "instance deleted");
        Ok(killed)
    }

    /// A command that runs `argv` inside the instance (all its namespaces, its
    /// root, a clean environment); the caller decides about stdio.
    pub fn exec_command(&self, id: &str, argv: &[String]) -> Result<Command> {
        let rec = self.running(id, "exec")?;
        let pid = rec.init.map(|i| i.pid).unwrap_or(0).to_string();
        let entry = crate::bounds::Entry::new(&rec.cgroups)?;
        let mut cmd = Command::new("nsenter");
        // The command is bound as the machine's own processes are: its
        // cgroups (and cgroup namespace), bounding set and seccomp filter.
        // SAFETY: only raw syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                entry.join()?;
                entry.confine()
            });
        }
        cmd.args([
            "-t",
            &pid,
            "-m",
            "-u",
            "-i",
            "-n",
            "-p",
            "-C",
            "-r",
            "-w",
            "--",
            "/usr/bin/env",
            "-i",
        ])
        .arg(format!("PATH={}", crate::userdata::PATH_ENV))
        .args(["HOME=/root", "LANG=C.UTF-8", "TERM=xterm"])
        .args(argv);
        Ok(cmd)
    }

    /// Runs `argv` inside the instance and returns its output.
    pub fn exec(&self, id: &str, argv: &[String]) -> Result<std::process::Output> {
        let mut cmd = self.exec_command(id, argv)?;
        cmd.stdin(Stdio::null())
            .output()
            .ctx("cannot run nsenter", "nsenter")
    }

    /// The user-data runner's result record, once it has finished.
    pub fn user_data_result(&self, id: &str) -> Result<Option<serde_json::Value>> {
        let rec = self.running(id, "read user-data result")?;
        let path = PathBuf::from(format!(
            "/proc/{}/root{}",
            rec.init.map(|i| i.pid).unwrap_or(0),
            crate::userdata::RESULT
        ));
        state::read_opt(&path)
    }

    /// Waits for the user-data runner to finish and returns its result record.
    pub fn wait_user_data(&self, id: &str, timeout: Duration) -> Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.user_data_result(id)? {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(LocalError::Boot {
                    id: id.into(),
                    message: format!("user data still running after {}s", timeout.as_secs()),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    // ---- name and password (adding existing instances) ---------------------

    /// Renames an instance: its name attribute and its hostname, which the
    /// metadata endpoint serves from the record. A running instance takes
    /// the new hostname at once (sethostname in its UTS namespace,
    /// `/etc/hostname` and its `/etc/hosts` entry rewritten inside); every
    /// later boot sets it from the record, as for any instance.
    pub fn rename(&self, id: &str, name: &str) -> Result<Instance> {
        check_instance_name(name)
            .map_err(|rule| LocalError::invalid("name", format!("{name:?}"), rule))?;
        let (rec, old) = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.instance(id)?;
            let old = std::mem::replace(&mut rec.hostname, name.to_string());
            rec.template.name = Some(name.to_string());
            rec.template.hostname = Some(name.to_string());
            self.state.put_instance(&rec)?;
            (rec, old)
        };
        if rec.state == InstanceState::Running && rec.init.is_some_and(|i| i.alive()) {
            self.apply_hostname(&rec, &old)?;
        }
        tracing::info!(id, name, old = %old, "instance renamed");
        self.view(rec)
    }

    /// The record's hostname inside a running instance, at once.
    pub(super) fn apply_hostname(&self, rec: &InstanceRecord, old: &str) -> Result<()> {
        let pid = rec.init.map(|i| i.pid).unwrap_or(0);
        let ns = PathBuf::from(format!("/proc/{pid}/ns/uts"));
        let uts = std::fs::File::open(&ns).ctx("cannot open", &ns)?;
        let name = rec.hostname.clone();
        // setns(CLONE_NEWUTS) moves only the calling thread: a thread of its
        // own enters the instance's UTS namespace and ends with it.
        std::thread::spawn(move || -> Result<()> {
            nix::sched::setns(&uts, nix::sched::CloneFlags::CLONE_NEWUTS)
                .sys(|| format!("setns into the UTS namespace of {pid}"))?;
            nix::unistd::sethostname(&name).sys(|| format!("sethostname {name}"))
        })
        .join()
        .map_err(|_| LocalError::Boot {
            id: rec.id.clone(),
            message: "the thread setting the hostname panicked".into(),
        })??;
        // The files are rewritten by the instance's own shell, in its own
        // mount namespace: nothing of the host is written, whatever links
        // the instance holds.
        let script = hostname_script(&rec.hostname, &rec.private_ip, old)?;
        let command = format!(
            "sh (rewrite /etc/hostname and /etc/hosts) inside {}",
            rec.id
        );
        let argv = ["/bin/sh".to_string(), "-c".into(), script];
        let out = self.guest_step(&rec.id, &command, &argv, b"")?;
        if !out.success() {
            return Err(LocalError::Command {
                command,
                status: out.status.to_string(),
                stderr: out.stderr_text().trim().to_string(),
            });
        }
        Ok(())
    }

    /// Runs one of knit's own steps inside the instance: `argv` with
    /// `input` on stdin, killed past [`GUEST_STEP_TIMEOUT`]. `command`
    /// names it in errors (not nsenter's long command line).
    fn guest_step(
        &self,
        id: &str,
        command: &str,
        argv: &[String],
        input: &[u8],
    ) -> Result<knit_os::command::Output> {
        let mut cmd = self.exec_command(id, argv)?;
        knit_os::command::run_with_input(&mut cmd, input, GUEST_STEP_TIMEOUT, GUEST_STEP_OUTPUT_CAP)
            .map_err(|e| match LocalError::from(e) {
                LocalError::Command { status, stderr, .. } => LocalError::Command {
                    command: command.to_string(),
                    status,
                    stderr,
                },
                other => other,
            })
    }

    /// Sets root's password inside a running instance: `chpasswd -c SHA512`
    /// runs in the instance's own namespaces and root and reads
    /// `root:<password>` on its stdin (never argv), so only the instance's
    /// `/etc/shadow` changes (copied up into its system layer), never the
    /// base root's. The record keeps that and when a password was set, never
    /// the password or its hash; errors never carry it.
    pub fn set_password(&self, id: &str, password: &str) -> Result<Instance> {
        check_password(password)?;
        self.running(id, "set the root password")?;
        let argv = ["chpasswd".to_string(), "-c".into(), "SHA512".into()];
        let command = format!("chpasswd -c SHA512 inside {id}");
        // One line shorter than PIPE_BUF into an empty pipe: chpasswd
        // gets it whole or not at all, never a cut password.
        let line = format!("root:{password}\n");
        let out = self
            .guest_step(id, &command, &argv, line.as_bytes())
            .map_err(|e| match e {
                LocalError::Command {
                    command,
                    status,
                    stderr,
                } => LocalError::Command {
                    command,
                    status,
                    stderr: stderr.replace(password, "(redacted)"),
                },
                other => other,
            })?;
        if !out.success() {
            let mut stderr = out
                .stderr_text()
                .replace(password, "(redacted)")
                .trim()
                .to_string();
            if out.status.code() == Some(127) {
                stderr.push_str(
                    " (the instance's image has no chpasswd: it needs the passwd package)",
                );
            }
            return Err(LocalError::Command {
                command,
                status: out.status.to_string(),
                stderr,
            });
        }
        let rec = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.instance(id)?;
            rec.password_set_at = Some(now());
            // The attribute says the instance logs in by password; its value
            // is never kept.
            rec.template.attributes.login.password = Some(REDACTED.into());
            self.state.put_instance(&rec)?;
            rec
        };
        tracing::info!(id, "root password set");
        self.view(rec)
    }
}

/// A password chpasswd can take as one `root:<password>` line. The error
/// names its length, never its value.
pub(super) fn check_password(p: &str) -> Result<()> {
    let value = format!("<{} characters>", p.chars().count());
    if p.is_empty() || p.len() > 256 {
        return Err(LocalError::invalid(
            "password",
            value,
            "must be 1 to 256 bytes",
        ));
    }
    if p.contains(['\n', '\r', '\0']) {
        return Err(LocalError::invalid(
            "password",
            value,
            "must not contain a newline, carriage return or NUL (chpasswd reads one root:password line)",
        ));
    }
    Ok(())
}

/// knit's guest-hostname routine for a running instance: `/etc/hostname`
/// and its `/etc/hosts` entry; the running name is set with sethostname
/// before (an image directory may have no hostname tool).
pub(super) fn hostname_script(name: &str, ip: &str, old: &str) -> Result<String> {
    let hosts = knit_api::shell::HostsEntry { ip, old };
    knit_api::shell::guest_hostname(name, Some(hosts), knit_api::shell::LiveHostname::Skip)
        .map_err(|e| LocalError::invalid("hostname", format!("{name:?}"), e.rule))
}

/// Reads the boot shim's handshake (`crate::boot`): the `pid N` line of
/// the shim and the `ready` line of PID 1 come from two processes on one
/// pipe, in either order (PID 1 may finish its setup before the shim, just
/// back from fork, has written its line), so both are awaited. `next`
/// gives the next line, `None` at the end of the pipe, `Err` once the boot
/// timeout has passed. Returns PID 1's host pid, or the failure's message.
fn init_handshake(
    mut next: impl FnMut() -> std::result::Result<Option<String>, mpsc::RecvTimeoutError>,
) -> std::result::Result<i32, String> {
    let (mut pid, mut ready) = (None, false);
    loop {
        if let (Some(pid), true) = (pid, ready) {
            return Ok(pid);
        }
        match next() {
            Ok(Some(line)) => {
                if let Some(p) = line
                    .strip_prefix("pid ")
                    .and_then(|p| p.trim().parse().ok())
                {
                    pid = Some(p);
                } else if line == "ready" {
                    ready = true;
                } else if let Some(msg) = line.strip_prefix("error ") {
                    return Err(msg.to_string());
                }
            }
            Ok(None) if ready => return Err("the boot shim ended without naming PID 1".into()),
            Ok(None) => return Err("init exited before it was ready".into()),
            Err(_) => return Err(format!("not ready after {}s", BOOT_TIMEOUT.as_secs())),
        }
    }
}

/// SIGKILLs every process `list` names until it names none (a process can
/// fork while its siblings die, so one pass is not enough), for at most
/// [`KILL_ROUNDS`] rounds; each pid killed goes into `killed`.
fn kill_until_empty(list: impl Fn() -> Vec<i32>, killed: &mut BTreeSet<i32>) {
    for _ in 0..KILL_ROUNDS {
        let pids = list();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed.insert(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rounds of [`kill_until_empty`]: 100 × 20 ms, two seconds at most.
const KILL_ROUNDS: usize = 100;

/// How long a step knit runs inside an instance (its hostname files
/// rewritten, chpasswd) may take: a few small files; past it the instance
/// is hung, and the caller is not held with it.
const GUEST_STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Output kept of such a step, each stream: its error messages.
const GUEST_STEP_OUTPUT_CAP: usize = 64 << 10;

/// The instance an earlier create with this client token made, if it
/// still exists (`records`: every instance, read under the state lock).
fn by_client_token(records: &[InstanceRecord], token: Option<&str>) -> Option<InstanceRecord> {
    let token = token?;
    records
        .iter()
        .find(|r| r.template.client_token.as_deref() == Some(token))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rename's script parses with any name (the routine itself is run
    /// with awkward values in knit-api's tests), and a NUL is refused.
    #[test]
    fn hostname_script_parses_with_awkward_values() {
        for v in ["it's", "a b", "$x `y` $(z)", "l1\nl2", "'\\'"] {
            let script = hostname_script(v, "10.0.0.1", v).unwrap();
            let out = std::process::Command::new("/bin/sh")
                .args(["-n", "-c", &script])
                .output()
                .unwrap();
            assert!(out.status.success(), "{v:?}: {out:?}");
            assert!(script.contains("live='skip'"), "{script}");
        }
        let e = hostname_script("a\0b", "10.0.0.1", "old").unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
    }

    /// The shim's `pid N` and PID 1's `ready` are taken in either order:
    /// PID 1 can say `ready` before the shim, descheduled after fork, names
    /// it (a loaded host; the instance then ran with no init on record and
    /// every exec in it was refused as "its init is gone").
    #[test]
    fn the_init_handshake_takes_pid_and_ready_in_either_order() {
        let feed = |lines: &[&str]| {
            let mut it = lines.iter().map(|l| l.to_string());
            init_handshake(move || Ok(it.next()))
        };
        assert_eq!(feed(&["pid 42", "ready"]), Ok(42));
        assert_eq!(feed(&["ready", "pid 42"]), Ok(42));
        assert_eq!(feed(&["noise", "ready", "more", "pid 7"]), Ok(7));
        let ended = feed(&["ready"]).unwrap_err();
        assert!(ended.contains("without naming PID 1"), "{ended}");
        assert_eq!(
            feed(&["pid 42"]),
            Err("init exited before it was ready".to_string())
        );
        assert_eq!(
            feed(&["pid 42", "error mount failed"]),
            Err("mount failed".to_string())
        );
        let late = init_handshake(|| Err(mpsc::RecvTimeoutError::Timeout)).unwrap_err();
        assert!(late.starts_with("not ready after"), "{late}");
    }

    /// Every process the list names is killed, then the list comes back
    /// empty and the helper returns: here a child of the test, listed while
    /// it has not ended.
    #[test]
    fn kill_until_empty_kills_what_the_list_names_until_it_is_empty() {
        use std::os::unix::process::ExitStatusExt;
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id() as i32;
        let child = std::cell::RefCell::new(child);
        let status = std::cell::Cell::new(None);
        let list = || {
            // Reaped here, so a killed child stops being listed.
            match child.borrow_mut().try_wait() {
                Ok(Some(s)) => {
                    status.set(Some(s));
                    Vec::new()
                }
                _ => vec![pid],
            }
        };
        let mut killed = BTreeSet::new();
        kill_until_empty(list, &mut killed);
        if status.get().is_none() {
            // Not ended within the rounds: end it, then fail.
            let _ = child.borrow_mut().kill();
            let _ = child.borrow_mut().wait();
            panic!("sleep {pid} still running after kill_until_empty");
        }
        assert_eq!(killed, BTreeSet::from([pid]));
        assert_eq!(status.get().and_then(|s| s.signal()), Some(libc::SIGKILL));
    }
}
