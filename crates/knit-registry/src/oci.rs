//! The system images knit serves its nodes, built here with no network: an
//! OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/<hex>`) of
//! real images (OCI manifest, config and gzipped tar layers, every blob
//! named by its sha256), read back by the control plane's registry
//! (`knit-server`'s `/v2/`).
//!
//! What each image holds:
//! - `registry.k8s.io/pause:*`: the real thing, a pause process. `/pause`
//!   is a 213-byte static x86-64 ELF made here ([`pause_elf`]): it blocks
//!   SIGINT, SIGTERM and SIGCHLD, waits for them (`rt_sigtimedwait`),
//!   reaps every exited child on SIGCHLD (`wait4(-1, WNOHANG)`) and exits
//!   0 on SIGINT or SIGTERM, as Kubernetes' `pause.c` does. Entrypoint
//!   `/pause`, user 65535:65535, as upstream's.
//! - every other reference (kube-proxy, flannel, …): a stand-in. Nothing
//!   of the named program is inside: one layer with the same `/pause` as
//!   its entrypoint (run, it waits and exits on SIGTERM) and
//!   `/etc/knit-stand-in` saying what it stands for. No container runs on
//!   the local cloud (the kubelet is a stand-in too): nodes pull these
//!   images through their real containerd, which is what is exercised.
//!
//! The build is deterministic (mtime 0, root owner, gzip without a name or
//! time, JSON with sorted keys): the same references give the same digests
//! on every host and every run, so a node that cached them (a data-disk
//! snapshot) finds them present.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{io, RegistryError, Result};

pub const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The whole reference (`registry.k8s.io/pause:3.10`), as containerd's
/// import names an image.
pub const NAME_ANNOTATION: &str = "io.containerd.image.name";
/// The tag alone, as the OCI image layout names a reference.
pub const REF_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// Caps on what is read back from a layout (index, manifests): a layout is
/// written by knit, but a damaged one must not be read whole into memory.
const MAX_INDEX_BYTES: u64 = 1 << 20;
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// The machine code of `/pause` (x86-64, Linux system calls), assembled
/// from:
///
/// ```text
/// _start: push 0x14002           # sigset: SIGINT(2) SIGTERM(15) SIGCHLD(17)
///         xor  edi, edi          # SIG_BLOCK
///         mov  rsi, rsp
///         xor  edx, edx
///         mov  r10d, 8
///         mov  eax, 14           # rt_sigprocmask
///         syscall
/// wait:   mov  rdi, rsp
///         xor  esi, esi
///         xor  edx, edx          # no timeout
///         mov  r10d, 8
///         mov  eax, 128          # rt_sigtimedwait
///         syscall
///         cmp  eax, 17           # SIGCHLD: reap
///         jne  other
/// reap:   mov  rdi, -1
///         xor  esi, esi
///         mov  edx, 1            # WNOHANG
///         xor  r10d, r10d
///         mov  eax, 61           # wait4
///         syscall
///         test eax, eax
///         jg   reap
///         jmp  wait
/// other:  test eax, eax          # an error (EINTR): wait again
///         js   wait
///         xor  edi, edi          # SIGINT or SIGTERM: exit 0
///         mov  eax, 231          # exit_group
///         syscall
/// ```
const PAUSE_CODE: [u8; 93] = [
    0x68, 0x02, 0x40, 0x01, 0x00, 0x31, 0xff, 0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41, 0xba, 0x08, 0x00,
    0x00, 0x00, 0xb8, 0x0e, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x89, 0xe7, 0x31, 0xf6, 0x31, 0xd2,
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00, 0xb8, 0x80, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x83, 0xf8, 0x11,
    0x75, 0x1e, 0x48, 0xc7, 0xc7, 0xff, 0xff, 0xff, 0xff, 0x31, 0xf6, 0xba, 0x01, 0x00, 0x00, 0x00,
    0x45, 0x31, 0xd2, 0xb8, 0x3d, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x85, 0xc0, 0x7f, 0xe4, 0xeb, 0xc9,
    0x85, 0xc0, 0x78, 0xc5, 0x31, 0xff, 0xb8, 0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05,
];

/// `/pause`: a static ELF64 executable, one read+execute `PT_LOAD` segment
/// (the headers and [`PAUSE_CODE`]) at 0x400000, entry after the headers.
pub fn pause_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const EHDR: u16 = 64;
    const PHDR: u16 = 56;
    let entry = BASE + u64::from(EHDR + PHDR);
    let total = u64::from(EHDR + PHDR) + PAUSE_CODE.len() as u64;
    let mut f = Vec::with_capacity(total as usize);
    // e_ident: ELF, 64-bit, little endian, version 1, System V ABI.
    f.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
    f.extend_from_slice(&62u16.to_le_bytes()); // e_machine: x86-64
    f.extend_from_slice(&1u32.to_le_bytes()); // e_version
    f.extend_from_slice(&entry.to_le_bytes()); // e_entry
    f.extend_from_slice(&u64::from(EHDR).to_le_bytes()); // e_phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // e_shoff: no sections
    f.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    f.extend_from_slice(&EHDR.to_le_bytes()); // e_ehsize
    f.extend_from_slice(&PHDR.to_le_bytes()); // e_phentsize
    f.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    f.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    f.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    f.extend_from_slice(&1u32.to_le_bytes()); // p_type: PT_LOAD
    f.extend_from_slice(&5u32.to_le_bytes()); // p_flags: R + X
    f.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    f.extend_from_slice(&BASE.to_le_bytes()); // p_vaddr
    f.extend_from_slice(&BASE.to_le_bytes()); // p_paddr
    f.extend_from_slice(&total.to_le_bytes()); // p_filesz
    f.extend_from_slice(&total.to_le_bytes()); // p_memsz
    f.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    f.extend_from_slice(&PAUSE_CODE);
    f
}

/// `host/repo:tag` split; the host defaults to `docker.io` (and a one-part
/// Docker Hub repository is `library/<name>`), as containerd names images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub host: String,
    pub repo: String,
    pub tag: String,
}

impl Reference {
    pub fn parse(reference: &str) -> Result<Reference> {
        let bad = |why: &str| RegistryError::Invalid(format!("image {reference:?}: {why}"));
        let (name, tag) = reference
            .rsplit_once(':')
            .filter(|(_, t)| !t.contains('/'))
            .ok_or_else(|| bad("expected [host/]repository:tag"))?;
        let (host, repo) = match name.split_once('/') {
            Some((h, rest)) if h.contains('.') || h.contains(':') || h == "localhost" => {
                (h.to_string(), rest.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let repo = if host == "docker.io" && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        let ok = |s: &str, extra: &[char]| {
            !s.is_empty()
                && s.chars().all(|c| {
                    c.is_ascii_lowercase()
                        || c.is_ascii_digit()
                        || "._-".contains(c)
                        || extra.contains(&c)
                })
        };
        // Each path component starts and ends with a letter or digit (the
        // distribution grammar): no `..`, no empty component.
        let alnum =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !ok(&repo, &['/'])
            || repo
                .split('/')
                .any(|p| !alnum(p.chars().next()) || !alnum(p.chars().last()))
        {
            return Err(bad(
                "repository: lowercase letters, digits, '.', '_', '-', '/'",
            ));
        }
        if tag.len() > 128
            || !tag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            || tag.is_empty()
        {
            return Err(bad("tag: letters, digits, '.', '_', '-' (128 at most)"));
        }
        Ok(Reference {
            host,
            repo,
            tag: tag.to_string(),
        })
    }

    pub fn full(&self) -> String {
        format!("{}/{}:{}", self.host, self.repo, self.tag)
    }

    /// The real pause image, or a stand-in for something else.
    pub fn is_pause(&self) -> bool {
        self.repo == "pause" || self.repo.ends_with("/pause")
    }
}

/// One image of a layout, as its index names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub reference: Reference,
    pub digest: String,
    pub size: u64,
    pub media_type: String,
}

/// The OCI platform of this host (`GOARCH` names).
fn architecture() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        other => Err(RegistryError::Invalid(format!(
            "the system images' /pause is x86-64 machine code; this host is {other}"
        ))),
    }
}

fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// `sha256:<64 hex>` → the hex part, else `None`.
pub fn digest_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}

/// Writes a blob under `dir/blobs/sha256/` unless it is there (a blob's
/// name is its content): a temporary file renamed into place.
fn put_blob(dir: &Path, data: &[u8]) -> Result<(String, u64)> {
    let digest = sha256_digest(data);
    let blobs = dir.join("blobs/sha256");
    let path = blobs.join(&digest["sha256:".len()..]);
    let present = std::fs::metadata(&path).is_ok_and(|m| m.len() == data.len() as u64);
    if !present {
        std::fs::create_dir_all(&blobs).map_err(io(blobs.display()))?;
        write_atomic(&path, data)?;
    }
    Ok((digest, data.len() as u64))
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    // 0600 as the temporary file it used to be renamed from.
    Ok(knit_os::durable::write(path, data, 0o600)?)
}

/// One file of a layer: path, mode, content.
type LayerFile<'a> = (&'a str, u32, &'a [u8]);

/// A tar of `files` (path, mode, content), every entry owned by root with
/// mtime 0, its parent directories first; returns (tar.gz, diff id).
fn layer(files: &[LayerFile]) -> Result<(Vec<u8>, String)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut dirs: Vec<String> = Vec::new();
    let header = |size: u64, mode: u32, kind: tar::EntryType| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    };
    for (path, mode, data) in files {
        let parts: Vec<&str> = path.split('/').collect();
        for i in 1..parts.len() {
            let d = format!("{}/", parts[..i].join("/"));
            if !dirs.contains(&d) {
                let mut h = header(0, 0o755, tar::EntryType::Directory);
                tar.append_data(&mut h, &d, std::io::empty())
                    .map_err(io("build a layer"))?;
                dirs.push(d);
            }
        }
        let mut h = header(data.len() as u64, *mode, tar::EntryType::Regular);
        tar.append_data(&mut h, path, *data)
            .map_err(io("build a layer"))?;
    }
    let tar = tar.into_inner().map_err(io("build a layer"))?;
    let diff_id = sha256_digest(&tar);
    // No name, mtime 0, no OS byte dependence: the same bytes everywhere.
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).map_err(io("gzip a layer"))?;
    let gz = gz.finish().map_err(io("gzip a layer"))?;
    Ok((gz, diff_id))
}

/// Builds one image's blobs into the layout; returns its index entry.
fn build_one(dir: &Path, reference: &Reference) -> Result<Entry> {
    let arch = architecture()?;
    let pause = pause_elf();
    let full = reference.full();
    let note = format!(
        "A stand-in for {full}, built by knit (no network).\n\
         It holds none of that program: only /pause (knit's pause process)\n\
         as its entrypoint, and this file. No container runs on knit's\n\
         local cloud; nodes pull this image through their containerd.\n"
    );
    let (files, kind, created_by): (Vec<LayerFile>, &str, String) = if reference.is_pause() {
        (
            vec![("pause", 0o755, &pause)],
            "pause",
            "knit: /pause, a static x86-64 pause process (pause.c's behaviour)".to_string(),
        )
    } else {
        (
            vec![
                ("etc/knit-stand-in", 0o644, note.as_bytes()),
                ("pause", 0o755, &pause),
            ],
            "stand-in",
            format!("knit: a stand-in for {full} (/pause and /etc/knit-stand-in)"),
        )
    };
    let (gz, diff_id) = layer(&files)?;
    let (layer_digest, layer_size) = put_blob(dir, &gz)?;
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": ["/pause"],
            "User": "65535:65535",
            "WorkingDir": "/",
            "Labels": {
                "dev.knit.image": kind,
                "dev.knit.reference": full,
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": created_by}],
    });
    let config = serde_json::to_vec(&config)
        .map_err(|e| RegistryError::Invalid(format!("encode the config of {full}: {e}")))?;
    let (config_digest, config_size) = put_blob(dir, &config)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer_size}],
        "annotations": {"org.opencontainers.image.title": full},
    });
    let manifest = serde_json::to_vec(&manifest)
        .map_err(|e| RegistryError::Invalid(format!("encode the manifest of {full}: {e}")))?;
    let (digest, size) = put_blob(dir, &manifest)?;
    Ok(Entry {
        reference: reference.clone(),
        digest,
        size,
        media_type: MANIFEST_TYPE.to_string(),
    })
}

/// Builds the images `references` name into the OCI image layout at `dir`
/// (blobs kept, `index.json` replaced in one rename). Nothing is fetched.
pub fn build_layout(dir: &Path, references: &[String]) -> Result<Vec<Entry>> {
    let refs = references
        .iter()
        .map(|r| Reference::parse(r))
        .collect::<Result<Vec<_>>>()?;
    std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
    let entries = refs
        .iter()
        .map(|r| build_one(dir, r))
        .collect::<Result<Vec<_>>>()?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": entries.iter().map(|e| serde_json::json!({
            "mediaType": e.media_type,
            "digest": e.digest,
            "size": e.size,
            "annotations": {
                NAME_ANNOTATION: e.reference.full(),
                REF_ANNOTATION: e.reference.tag,
            },
        })).collect::<Vec<_>>(),
    });
    let index = serde_json::to_vec_pretty(&index)
        .map_err(|e| RegistryError::Invalid(format!("encode index.json: {e}")))?;
    write_atomic(
        &dir.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    write_atomic(&dir.join("index.json"), &index)?;
    Ok(entries)
}

/// A layout read back: its index's images, and where its blobs are.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub entries: Vec<Entry>,
}

impl Layout {
    /// Reads `dir/index.json` (entries without a full-name annotation or
    /// with a malformed digest are skipped).
    pub fn open(dir: &Path) -> Result<Layout> {
        let path = dir.join("index.json");
        let meta = std::fs::metadata(&path).map_err(io(path.display()))?;
        if meta.len() > MAX_INDEX_BYTES {
            return Err(RegistryError::Invalid(format!(
                "{}: {} bytes, more than {MAX_INDEX_BYTES}",
                path.display(),
                meta.len()
            )));
        }
        let text = std::fs::read(&path).map_err(io(path.display()))?;
        let index: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| RegistryError::Invalid(format!("{}: {e}", path.display())))?;
        let entries = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let name = m["annotations"][NAME_ANNOTATION].as_str()?;
                let digest = m["digest"].as_str()?;
                digest_hex(digest)?;
                Some(Entry {
                    reference: Reference::parse(name).ok()?,
                    digest: digest.to_string(),
                    size: m["size"].as_u64()?,
                    media_type: m["mediaType"].as_str()?.to_string(),
                })
            })
            .collect();
        Ok(Layout {
            dir: dir.to_path_buf(),
            entries,
        })
    }

    /// The image a registry request names: repository `repo` (as in the
    /// URL path), `reference` a tag or a manifest digest, `ns` the
    /// registry host containerd mirrors for (`?ns=`), any host when absent.
    pub fn manifest(&self, ns: Option<&str>, repo: &str, reference: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| {
            e.reference.repo == repo
                && ns.is_none_or(|h| h == e.reference.host)
                && (e.reference.tag == reference || e.digest == reference)
        })
    }

    /// Whether repository `repo` (under `ns`, when given) exists here.
    pub fn has_repository(&self, ns: Option<&str>, repo: &str) -> bool {
        self.entries
            .iter()
            .any(|e| e.reference.repo == repo && ns.is_none_or(|h| h == e.reference.host))
    }

    /// The file of blob `digest`, when it is a well-formed sha256 digest
    /// and present.
    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest_hex(digest)?;
        let path = self.dir.join("blobs/sha256").join(hex);
        path.is_file().then_some(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    const IMAGES: [&str; 3] = [
        "registry.k8s.io/pause:3.10",
        "registry.k8s.io/kube-proxy:v1.31.4",
        "docker.io/flannel/flannel:v0.26.1",
    ];

    fn owned(refs: &[&str]) -> Vec<String> {
        refs.iter().map(|s| s.to_string()).collect()
    }

    fn blob(dir: &Path, digest: &str) -> Vec<u8> {
        std::fs::read(dir.join("blobs/sha256").join(digest_hex(digest).unwrap())).unwrap()
    }

    #[test]
    fn references_parse_as_containerd_names_them() {
        let r = Reference::parse("registry.k8s.io/pause:3.10").unwrap();
        assert_eq!(
            (r.host.as_str(), r.repo.as_str(), r.tag.as_str()),
            ("registry.k8s.io", "pause", "3.10")
        );
        assert!(r.is_pause());
        let r = Reference::parse("flannel/flannel:v0.26.1").unwrap();
        assert_eq!(r.full(), "docker.io/flannel/flannel:v0.26.1");
        assert!(!r.is_pause());
        assert_eq!(
            Reference::parse("busybox:1").unwrap().repo,
            "library/busybox"
        );
        for bad in ["pause", "x/../y:1", "Upper:1", "a:b/c", "a:", "a//b:1"] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    /// Every blob is named by its sha256, the media types are OCI's, the
    /// layer is a gzipped tar holding what the docs say, and a second
    /// build is byte for byte the same.
    #[test]
    fn the_layout_is_content_addressed_and_deterministic() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ea = build_layout(a.path(), &owned(&IMAGES)).unwrap();
        let eb = build_layout(b.path(), &owned(&IMAGES)).unwrap();
        assert_eq!(ea, eb);
        assert_eq!(
            std::fs::read(a.path().join("index.json")).unwrap(),
            std::fs::read(b.path().join("index.json")).unwrap()
        );
        for f in std::fs::read_dir(a.path().join("blobs/sha256")).unwrap() {
            let f = f.unwrap();
            let data = std::fs::read(f.path()).unwrap();
            assert_eq!(
                hex::encode(Sha256::digest(&data)),
                f.file_name().to_string_lossy()
            );
        }
        let layout = Layout::open(a.path()).unwrap();
        assert_eq!(layout.entries.len(), 3);
        for e in &layout.entries {
            let m: serde_json::Value = serde_json::from_slice(&blob(a.path(), &e.digest)).unwrap();
            assert_eq!(m["mediaType"], MANIFEST_TYPE);
            assert_eq!(m["config"]["mediaType"], CONFIG_TYPE);
            assert_eq!(m["layers"][0]["mediaType"], LAYER_TYPE);
            let config: serde_json::Value =
                serde_json::from_slice(&blob(a.path(), m["config"]["digest"].as_str().unwrap()))
                    .unwrap();
            assert_eq!(config["architecture"], "amd64");
            assert_eq!(config["config"]["Entrypoint"][0], "/pause");
            let gz = blob(a.path(), m["layers"][0]["digest"].as_str().unwrap());
            assert_eq!(m["layers"][0]["size"].as_u64().unwrap(), gz.len() as u64);
            let mut tar_bytes = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut tar_bytes)
                .unwrap();
            assert_eq!(config["rootfs"]["diff_ids"][0], sha256_digest(&tar_bytes));
            let mut names = Vec::new();
            let mut archive = tar::Archive::new(&tar_bytes[..]);
            for entry in archive.entries().unwrap() {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().display().to_string();
                if path == "pause" {
                    assert_eq!(entry.header().mode().unwrap(), 0o755);
                    let mut data = Vec::new();
                    std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                    assert_eq!(data, pause_elf());
                }
                names.push(path);
            }
            if e.reference.is_pause() {
                assert_eq!(names, ["pause"]);
            } else {
                assert_eq!(names, ["etc/", "etc/knit-stand-in", "pause"]);
            }
        }
        let pause = layout
            .manifest(Some("registry.k8s.io"), "pause", "3.10")
            .unwrap();
        assert_eq!(layout.manifest(None, "pause", &pause.digest), Some(pause));
        assert!(layout
            .manifest(Some("docker.io"), "pause", "3.10")
            .is_none());
        assert!(layout
            .manifest(Some("docker.io"), "flannel/flannel", "v0.26.1")
            .is_some());
        assert!(layout.blob_path(&pause.digest).is_some());
        assert!(layout.blob_path("sha256:../../etc/passwd").is_none());
    }

    /// `/proc/<pid>/syscall`'s first field: the system call it waits in.
    fn waits_in(pid: u32) -> Option<u64> {
        std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pause binary runs, waits in rt_sigtimedwait, reaps a child it
    /// inherits (no zombie left) and exits 0 on SIGTERM and on SIGINT.
    #[test]
    fn pause_waits_reaps_and_exits_on_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("pause");
        std::fs::write(&bin, pause_elf()).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // sh starts a short child, then becomes pause: the child's
            // exit is pause's SIGCHLD to handle.
            let mut child = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("sleep 0.3 & exec {}", bin.display()))
                .spawn()
                .unwrap();
            let pid = child.id();
            wait_until("pause never waited in rt_sigtimedwait", || {
                waits_in(pid) == Some(128)
            });
            let zombies = || {
                let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                    .unwrap_or_default();
                children
                    .split_whitespace()
                    .filter(|c| {
                        c.parse()
                            .ok()
                            .and_then(knit_os::proc::stat)
                            .is_some_and(|s| s.state == 'Z')
                    })
                    .count()
            };
            // The sleep ends and is reaped: no child of pause is left.
            wait_until("the exited child was not reaped", || {
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                    .is_ok_and(|c| c.trim().is_empty())
                    && zombies() == 0
            });
            assert!(
                child.try_wait().unwrap().is_none(),
                "pause exited on SIGCHLD"
            );
            // SAFETY: kill has no memory preconditions; pid is our child.
            unsafe { libc::kill(pid as i32, sig) };
            let status = child.wait().unwrap();
            assert_eq!(status.code(), Some(0), "signal {sig}: {status}");
        }
    }
}
