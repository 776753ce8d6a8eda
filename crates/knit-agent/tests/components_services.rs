//! The agent's own supervisor (no systemd here): real processes restarted
//! when they exit, resource limits applied, output logged, stopped by PID;
//! and a real containerd, with the config the agent renders, answering on
//! its socket under a temp root.

mod components_support;

use components_support::*;
use knit_agent::render::{self, RuntimeOptions};
use knit_agent::services::{self, ServiceSpec};
use std::time::Duration;

fn spec(name: &str, script: &str, log: &str) -> ServiceSpec {
    ServiceSpec {
        name: name.to_string(),
        exec: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![("KNIT_TEST_GREETING".into(), "hello".into())],
        limit_nofile: Some(4096),
        limit_core: None,
        limit_memlock: Some(1 << 20),
        log_file: log.to_string(),
    }
}

/// This process's hard limit on open files (the supervisor inherits it).
fn hard_nofile() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap()
        .1
}

fn limits_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap()
}

#[test]
fn supervisor_restarts_a_crashing_service_and_stop_ends_it() {
    let node = Node::new();
    let runs = node.path("/runs");
    // Appends a line per start, then fails.
    let crashing = spec(
        "crasher",
        &format!(
            "echo \"start $KNIT_TEST_GREETING\" >> {}; exit 3",
            runs.display()
        ),
        "/var/log/knit/crasher.log",
    );
    services::ensure_running(&node.host, &crashing).expect("start");
    assert!(services::is_running(&node.host, "crasher"));
    wait_for("three starts", Duration::from_secs(60), || {
        std::fs::read_to_string(&runs)
            .map(|t| t.lines().count() >= 3)
            .unwrap_or(false)
    });
    let runs_text = std::fs::read_to_string(&runs).unwrap();
    assert!(runs_text.lines().all(|l| l == "start hello"), "{runs_text}");
    let log = std::fs::read_to_string(node.path("/var/log/knit/crasher.log")).unwrap();
    assert!(log.contains("crasher exited: exit status: 3"), "{log}");
    assert!(
        log.contains("restarting crasher in 2s"),
        "backoff grows: {log}"
    );
    let supervisor = node.supervisor_pid("crasher").unwrap();
    services::stop(&node.host, "crasher").expect("stop");
    assert!(!pid_alive(supervisor));
    assert!(!services::is_running(&node.host, "crasher"));
    assert!(!node.path(&services::pid_file("crasher")).exists());
}

#[test]
fn supervised_service_gets_limits_output_and_is_not_restarted_by_a_rerun() {
    let node = Node::new();
    let long = spec(
        "sleeper",
        "echo \"out $KNIT_TEST_GREETING\"; echo err >&2; exec sleep 100000",
        "/var/log/knit/sleeper.log",
    );
    services::ensure_running(&node.host, &long).expect("start");
    let mut main = None;
    wait_for("the service pid", Duration::from_secs(30), || {
        main = services::main_pid(&node.host, "sleeper");
        main.is_some()
    });
    let main = main.unwrap();
    let supervisor = node.supervisor_pid("sleeper").unwrap();
    let limits = limits_of(main);
    let line = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    // The wanted limit, or this host's hard limit where that is lower (it
    // cannot be raised without CAP_SYS_RESOURCE).
    let expect = |resource, wanted: u64| {
        let hard = nix::sys::resource::getrlimit(resource).unwrap().1;
        match wanted.min(hard) {
            nix::sys::resource::RLIM_INFINITY => "unlimited unlimited".to_string(),
            n => format!("{n} {n}"),
        }
    };
    use nix::sys::resource::{Resource, RLIM_INFINITY};
    for (name, resource, wanted) in [
        ("Max open files", Resource::RLIMIT_NOFILE, 4096),
        ("Max core file size", Resource::RLIMIT_CORE, RLIM_INFINITY),
        ("Max locked memory", Resource::RLIMIT_MEMLOCK, 1 << 20),
    ] {
        let want = expect(resource, wanted);
        assert!(line(name).contains(&want), "{name}: want {want}\n{limits}");
    }
    wait_for("output in the log", Duration::from_secs(30), || {
        std::fs::read_to_string(node.path("/var/log/knit/sleeper.log"))
            .is_ok_and(|t| t.contains("out hello") && t.contains("err"))
    });

    // Nothing inherited from the starter is held open (a caller reading the
    // agent's output through a pipe would otherwise never see EOF).
    for pid in [supervisor, main] {
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
        {
            let target = std::fs::read_link(entry.path()).unwrap_or_default();
            assert!(
                !target.to_string_lossy().starts_with("pipe:"),
                "pid {pid} holds {} -> {}",
                entry.file_name().to_string_lossy(),
                target.display()
            );
        }
    }

    // The supervisor sleeps in the kernel until a signal comes (no
    // polling: while it waits there, the kernel shows the signals it
    // takes as unblocked); the service starts with nothing blocked.
    let status = |pid: i32, field: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_string()))
            .unwrap()
    };
    assert_eq!(
        u64::from_str_radix(&status(main, "SigBlk:"), 16).unwrap(),
        0
    );
    wait_for(
        "the supervisor asleep in sigtimedwait",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(format!("/proc/{supervisor}/wchan"))
                .is_ok_and(|w| w.contains("sigtimedwait"))
        },
    );

    // Same definition: nothing restarts.
    services::ensure_running(&node.host, &long).expect("ensure again");
    assert_eq!(node.supervisor_pid("sleeper"), Some(supervisor));
    assert_eq!(services::main_pid(&node.host, "sleeper"), Some(main));

    // The service dies: the supervisor starts it again.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(main),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut restarted = None;
    wait_for("a new service pid", Duration::from_secs(30), || {
        restarted = services::main_pid(&node.host, "sleeper").filter(|p| *p != main);
        restarted.is_some()
    });

    // A changed definition restarts the service under a new supervisor.
    let mut changed = long.clone();
    changed.limit_nofile = Some(8192);
    services::ensure_running(&node.host, &changed).expect("restart on change");
    let new_supervisor = node.supervisor_pid("sleeper").unwrap();
    assert_ne!(new_supervisor, supervisor);
    assert!(!pid_alive(supervisor));

    // The supervisor is killed outright: its service keeps running until a
    // new supervisor stops that leftover before starting its own copy.
    // The new supervisor writes its service's pid once it has started it.
    let mut orphan = None;
    wait_for("the changed service's pid", Duration::from_secs(30), || {
        orphan = services::main_pid(&node.host, "sleeper");
        orphan.is_some()
    });
    let orphan = orphan.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new_supervisor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the killed supervisor", Duration::from_secs(30), || {
        !pid_alive(new_supervisor)
    });
    assert!(pid_alive(orphan));
    services::ensure_running(&node.host, &changed).expect("start after a killed supervisor");
    wait_for("the leftover to stop", Duration::from_secs(30), || {
        !pid_alive(orphan)
    });
    let new_supervisor = node.supervisor_pid("sleeper").unwrap();
    let mut last = None;
    wait_for("the new service pid", Duration::from_secs(30), || {
        last = services::main_pid(&node.host, "sleeper").filter(|p| *p != orphan);
        last.is_some()
    });
    let last = last.unwrap();
    let log = std::fs::read_to_string(node.path("/var/log/knit/sleeper.log")).unwrap();
    assert!(
        log.contains(&format!("stopping leftover sleeper (pid {orphan})")),
        "{log}"
    );
    services::stop(&node.host, "sleeper").expect("stop");
    assert!(!pid_alive(new_supervisor));
    assert!(
        !pid_alive(last),
        "the service process is stopped with its supervisor"
    );
    assert!(services::main_pid(&node.host, "sleeper").is_none());
}

#[test]
fn real_containerd_under_the_supervisor_answers_on_its_socket() {
    let node = Node::new();
    let mut config = base_config();
    config
        .containerd
        .registry_mirrors
        .insert("docker.io".into(), vec!["https://mirror.invalid".into()]);
    config.containerd.insecure_registries = vec!["registry.invalid:5000".into()];
    config.containerd.max_concurrent_downloads = 5;
    let options = RuntimeOptions::new(&config, false);
    let toml = render::containerd_config(&node.host, &config.containerd, options);
    node.host
        .write_file(render::CONTAINERD_CONFIG, toml.as_bytes(), 0o644)
        .unwrap();
    for (registry, text) in render::registry_hosts(&config.containerd, None).unwrap() {
        node.host
            .write_file(
                &format!("{}/{registry}/hosts.toml", render::CONTAINERD_CERTS_D),
                text.as_bytes(),
                0o644,
            )
            .unwrap();
    }
    let spec = render::containerd_service(&node.host, &config.containerd, "/usr/bin/containerd");
    services::ensure_running(&node.host, &spec).expect("start containerd");
    let socket = node.host.host_path(render::CONTAINERD_SOCK);
    let mut out = None;
    wait_for("ctr version", Duration::from_secs(60), || {
        let o = std::process::Command::new("ctr")
            .args(["--address", &socket, "version"])
            .output()
            .unwrap();
        let ok = o.status.success();
        out = Some(o);
        ok
    });
    let stdout = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
    assert!(stdout.contains("Server:"), "{stdout}");
    // containerd uses the rendered root and the rendered limits.
    assert!(node.path("/var/lib/containerd").is_dir());
    let main = services::main_pid(&node.host, "containerd").unwrap();
    // The rendered LimitNOFILE, or, where the hard limit cannot be raised
    // (no CAP_SYS_RESOURCE, as in some containers), the nearest allowed value
    // and a log line saying so.
    let limits = limits_of(main);
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let log = std::fs::read_to_string(node.path(render::CONTAINERD_LOG)).unwrap();
    let applied = nofile.contains("1048576 1048576");
    let explained = log.contains("cannot apply LimitNOFILE=1048576")
        && nofile.contains(&format!("{hard} {hard}", hard = hard_nofile()));
    assert!(applied || explained, "{nofile}\n{log}");
    // The CRI plugin loaded the rendered config (registry config_path included).
    let o = std::process::Command::new("ctr")
        .args(["--address", &socket, "plugins", "ls"])
        .output()
        .unwrap();
    let plugins = String::from_utf8_lossy(&o.stdout).into_owned();
    let cri = plugins
        .lines()
        .find(|l| l.starts_with("io.containerd.grpc.v1") && l.contains(" cri "))
        .unwrap_or_else(|| panic!("no CRI plugin:\n{plugins}"));
    assert!(
        cri.trim_end().ends_with("ok"),
        "CRI plugin did not load the config: {cri}\n{plugins}"
    );
    services::stop(&node.host, "containerd").expect("stop containerd");
    assert!(!pid_alive(main));
}
