//! What adding an existing instance to a pool needs from the local cloud:
//! rename, set root's password, re-image onto another image directory. Real
//! instances on real loop devices and namespaces; run as root. Each test has
//! its own cloud (`down` on drop: success, failure and panic alike).

mod common;

use common::TestCloud;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn host_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap()
}

#[test]
fn rename_changes_the_name_the_metadata_and_the_hostname() {
    let t = TestCloud::new();
    let before_host = host_hostname();
    let inst = t.create("name: before-1\nsystemDiskSize: 256Mi\n");
    let id = inst.record.id.clone();
    let ip = inst.record.private_ip.clone();
    let gw = t.gateway();

    let renamed = t.cloud.rename(&id, "after-1.pool").unwrap();
    assert_eq!(renamed.record.hostname, "after-1.pool");
    assert_eq!(
        renamed.record.template.name.as_deref(),
        Some("after-1.pool")
    );
    let d = t.cloud.describe(&id).unwrap();
    assert_eq!(d.record.template.name.as_deref(), Some("after-1.pool"));
    assert_eq!(d.record.hostname, "after-1.pool");
    // What the metadata endpoint serves, asked from inside.
    assert_eq!(
        t.sh(
            &id,
            &format!("curl -sf http://{gw}/latest/meta-data/instance/instance-name")
        ),
        "after-1.pool"
    );
    assert_eq!(
        t.sh(
            &id,
            &format!("curl -sf http://{gw}/latest/meta-data/hostname")
        ),
        "after-1.pool"
    );
    // A running instance takes the hostname at once.
    assert_eq!(
        t.sh(&id, "cat /proc/sys/kernel/hostname /etc/hostname"),
        "after-1.pool\nafter-1.pool\n"
    );
    let hosts = t.sh(&id, "cat /etc/hosts");
    assert!(hosts.contains(&format!("{ip}\tafter-1.pool\n")), "{hosts}");
    assert!(!hosts.contains(&format!("{ip}\tbefore-1")), "{hosts}");
    assert_eq!(host_hostname(), before_host, "the host's hostname changed");

    // Bad names: refused with field, value and rule; nothing changes.
    for bad in ["Bad_Name", "", "-x", &"a".repeat(65)] {
        let e = t.cloud.rename(&id, bad).unwrap_err();
        assert_eq!(e.code(), "LocalInvalid", "{bad:?}: {e}");
        let s = e.to_string();
        assert!(
            s.contains("name: value") && s.contains(&format!("{bad:?}")) && s.contains("DNS"),
            "{s}"
        );
    }
    let e = t.cloud.rename("i-000000000000", "fine").unwrap_err();
    assert_eq!(e.code(), "LocalNotFound");
    assert_eq!(
        t.cloud.describe(&id).unwrap().record.hostname,
        "after-1.pool"
    );

    // The CLI verb, on a stopped instance: the next boot takes the name.
    t.cloud.stop(&id).unwrap();
    let out = t.cli(&["rename", &id, "third-1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["hostname"], "third-1");
    let out = t.cli(&["rename", &id, "No Spaces"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error[LocalInvalid]") && err.contains("\"No Spaces\""),
        "{err}"
    );
    t.cloud.start(&id).unwrap();
    assert_eq!(
        t.sh(&id, "cat /proc/sys/kernel/hostname /etc/hostname"),
        "third-1\nthird-1\n"
    );
    let hosts = t.sh(&id, "cat /etc/hosts");
    assert!(hosts.contains(&format!("{ip}\tthird-1\n")), "{hosts}");
    assert_eq!(host_hostname(), before_host);
}

/// `openssl passwd -6` of `password` with the salt of `hash`: equal when
/// the hash verifies the password. The password goes on stdin.
fn sha512_crypt(password: &str, hash: &str) -> String {
    let salt = hash.split('$').nth(2).expect("a $6$salt$ hash");
    let mut child = Command::new("openssl")
        .args(["passwd", "-6", "-salt", salt, "-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn root_hash(shadow: &str) -> String {
    shadow
        .lines()
        .find_map(|l| l.strip_prefix("root:"))
        .and_then(|rest| rest.split(':').next())
        .expect("a root line in shadow")
        .to_string()
}

/// Every record and log of the state directory, with its bytes: files up
/// to 4 MiB (disk images and the block store's files are larger, and
/// sparse), `.img` files never.
fn state_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file()
                && p.extension().is_none_or(|x| x != "img")
                && e.metadata().unwrap().len() <= 4 << 20
            {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

#[test]
fn set_password_changes_only_the_instances_shadow_and_is_never_kept() {
    let t = TestCloud::new();
    let host_shadow = std::fs::read("/etc/shadow").unwrap();
    let inst = t.create("name: pw-1\nsystemDiskSize: 256Mi\n");
    let id = inst.record.id.clone();
    let password = format!("Kn1t-pw-{}", std::process::id());

    let after = t.cloud.set_password(&id, &password).unwrap();
    assert!(after.record.password_set_at.is_some());
    assert_eq!(
        after.record.template.attributes.login.password.as_deref(),
        Some("(redacted)")
    );
    let hash = root_hash(&t.sh(&id, "cat /etc/shadow"));
    assert!(hash.starts_with("$6$"), "{hash}");
    assert_eq!(sha512_crypt(&password, &hash), hash, "the hash verifies");
    assert_ne!(sha512_crypt("not-it", &hash), hash);
    assert_eq!(
        std::fs::read("/etc/shadow").unwrap(),
        host_shadow,
        "the host's /etc/shadow changed"
    );

    // Through the CLI, the password on stdin.
    let second = format!("{password}-2");
    let mut child = common::cli_env(&t.dir, &t.bridge, &t.subnet)
        .args(["set-password", &id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{second}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&second));
    let hash2 = root_hash(&t.sh(&id, "cat /etc/shadow"));
    assert_eq!(sha512_crypt(&second, &hash2), hash2);
    assert_eq!(std::fs::read("/etc/shadow").unwrap(), host_shadow);

    // Refused passwords: the error names the field and rule, not the value.
    for bad in ["", "two\nlines", "nul\0byte"] {
        let e = t.cloud.set_password(&id, bad).unwrap_err();
        assert_eq!(e.code(), "LocalInvalid", "{e}");
        let s = e.to_string();
        assert!(s.contains("password: value <"), "{s}");
        if !bad.is_empty() {
            assert!(!s.contains(bad), "{s}");
        }
    }

    // Neither password nor its hash is in any record or log of the cloud.
    for (path, bytes) in state_files(&t.dir) {
        let text = String::from_utf8_lossy(&bytes);
        for secret in [
            password.as_str(),
            second.as_str(),
            hash.as_str(),
            hash2.as_str(),
        ] {
            assert!(
                !text.contains(secret),
                "{} holds a password or its hash",
                path.display()
            );
        }
    }

    // A stopped instance is refused; a re-image brings the image's shadow back.
    t.cloud.stop(&id).unwrap();
    let e = t.cloud.set_password(&id, &password).unwrap_err();
    assert_eq!(e.code(), "LocalWrongState", "{e}");
    let again = t.cloud.reimage(&id, None).unwrap();
    assert_eq!(again.record.password_set_at, None);
    assert_eq!(
        root_hash(&t.sh(&id, "cat /etc/shadow")),
        root_hash(&String::from_utf8_lossy(&host_shadow))
    );
    assert_eq!(std::fs::read("/etc/shadow").unwrap(), host_shadow);
}

/// A small image directory with its own os-release and a marker file
/// only this image has.
fn build_image(dir: &Path, marker: &str) {
    common::build_image(
        dir,
        "ID=knitpool\nVERSION_ID=\"2\"\nPRETTY_NAME=\"knit pool image\"\n",
    );
    std::fs::write(dir.join("knit-image-marker"), format!("{marker}\n")).unwrap();
}

#[test]
fn reimage_onto_another_image_keeps_data_disks() {
    let t = TestCloud::new();
    let image = t.dir.parent().unwrap().join("pool-image");
    build_image(&image, "from-the-pool-image");
    let inst =
        t.create("name: reimg-1\nsystemDiskSize: 256Mi\ndisks:\n- {name: data, size: 64Mi}\n");
    let id = inst.record.id.clone();
    let old_disk = inst.data_disks[0].id.clone();
    t.sh(&id, "printf 'keep-me\\n' > /dev/vdb && sync");
    let boots = t.cloud.describe(&id).unwrap().record.boots;

    // A bad image is refused before the instance is stopped.
    for bad in ["/nonexistent-knit-image", "relative/image"] {
        let e = t
            .cloud
            .reimage_from(&id, None, Some(Path::new(bad)))
            .unwrap_err();
        assert_eq!(e.code(), "LocalInvalid", "{e}");
        let s = e.to_string();
        assert!(s.contains("baseRoot: value") && s.contains(bad), "{s}");
    }
    let still = t.cloud.describe(&id).unwrap();
    assert!(still.alive, "a refused reimage stopped the instance");
    assert_eq!(still.record.boots, boots);
    assert_eq!(still.data_disks[0].id, old_disk);

    let after = t
        .cloud
        .reimage_from(
            &id,
            Some("#!/bin/sh\necho ran > /ran\n".into()),
            Some(&image),
        )
        .unwrap();
    assert_eq!(after.record.template.base_root, image);
    assert_eq!(after.record.os.id, "knitpool");
    assert_ne!(after.data_disks[0].id, old_disk, "new disk id");
    t.cloud
        .wait_user_data(&id, Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        t.sh(&id, "read x < /knit-image-marker; echo $x"),
        "from-the-pool-image\n"
    );
    assert_eq!(t.sh(&id, "read x < /dev/vdb; echo $x"), "keep-me\n");
    assert_eq!(t.sh(&id, "read x < /ran; echo $x"), "ran\n");
    assert_eq!(
        t.sh(&id, "test -e /usr/bin/apt-get && echo host || echo image"),
        "image\n"
    );
    assert!(!image.join("ran").exists(), "the image is read-only");

    // The CLI flag, back onto the host's root.
    let out = t.cli(&["reimage", &id, "--base-root", "/"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.sh(&id, "test -e /usr/bin/apt-get && echo host || echo image"),
        "host\n"
    );
    assert_eq!(t.sh(&id, "head -1 /dev/vdb"), "keep-me\n");
}
