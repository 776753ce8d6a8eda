//! The Kubernetes package (`kubernetes-<version>-linux-amd64.tar.gz`, holding
//! `pkg/kubernetes/`): found in the data-disk cache, a local directory or a
//! mirror URL; verified by sha256 (tarball and every file); cached on the data
//! disk; its binaries installed.
//!
//! Everything streams through fixed buffers: a 100 MB kubelet never sits in
//! memory.

use crate::error::{AgentError, Context, Result};
use crate::host::Host;
use knit_api::{ErrorCode, KubernetesPackage, PhaseName};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// The log scope of what this module does: the phase that calls it.
const SCOPE: &str = PhaseName::KubernetesComponents.as_str();

/// The cache directory inside the data disk (docs/spec.md §1.3.2, ACK's layout).
pub const CACHE_SUBDIR: &str = "ack/kubernetes";
pub const CACHE_MANIFEST: &str = "knit-cache.json";
pub const PACKAGE_MANIFEST: &str = "knit-package.json";
pub const PACKAGE_PREFIX: &str = "pkg/kubernetes";
pub const BIN_DIR: &str = "/usr/local/bin";
/// Downloads and unpacked packages, removed after installation.
pub const STAGING_DIR: &str = "/var/lib/knit/staging";

/// `knit-package.json` inside the tarball.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageManifest {
    pub version: String,
    #[serde(default)]
    pub containerd_version: Option<String>,
    /// Path relative to `pkg/kubernetes/` → sha256 (hex).
    pub files: BTreeMap<String, String>,
}

/// `knit-cache.json` beside the cached files: its shape is shared with the
/// control plane (`knit-agent cache-manifest`).
pub use knit_api::agent::CacheManifest;

/// Where a verified package came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Cache,
    /// The package `knit image preload` put into the node image.
    Preloaded,
    /// A cache made by hand (the seed's `mv pkg/kubernetes`): checked
    /// against the package's own manifest.
    HandMadeCache,
    LocalDir(String),
    LocalTarball(String),
    Download {
        url: String,
        bytes: u64,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Cache => write!(f, "the data-disk cache"),
            Source::Preloaded => write!(f, "the node image ({PRELOAD_DIR})"),
            Source::HandMadeCache => write!(f, "the data-disk cache (made by hand)"),
            Source::LocalDir(dir) => write!(f, "{dir}"),
            Source::LocalTarball(path) => write!(f, "{path}"),
            Source::Download { url, .. } => write!(f, "{url}"),
        }
    }
}

/// A verified, unpacked package.
#[derive(Debug, Clone)]
pub struct Package {
    /// Host path of the directory with the content of `pkg/kubernetes/`.
    pub dir: PathBuf,
    pub manifest: PackageManifest,
    pub tarball_sha256: String,
    pub source: Source,
    /// The files this run hashed and found as the manifest says, by
    /// identity: met again under another name (a preloaded image's
    /// installed binary is a hard link to its cache file), a file is known
    /// to hold those bytes without reading it again.
    pub verified: Verified,
}

impl Package {
    /// Whether `path` is the very file this run hashed as the package's
    /// `rel` (a hard link to it: same device, inode, size and change time).
    /// A symbolic link is not followed: it is not that file.
    fn is_verified_file(&self, rel: &str, path: &Path) -> bool {
        fs::symlink_metadata(path)
            .is_ok_and(|meta| self.verified.get(rel) == Some(&FileId::of(&meta)))
    }
}

pub use knit_os::digest::sha256_file;

/// Manifest path → identity of the file whose bytes were hashed.
pub type Verified = BTreeMap<String, FileId>;

/// What tells one file from every other: device and inode, with its size
/// and change time. A write, truncation, chmod or new link moves the change
/// time (to the kernel clock's tick; no user can set it back), and a removed
/// file's inode number taken again comes with a new one: the same identity
/// later in a run is the same file, unchanged since (but for a write in the
/// same tick: the race any check before use has). Overlayfs (a node's root
/// over its image) keeps this: a file copied up from a hard-linked lower
/// file gets its own inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl FileId {
    fn of(meta: &fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

/// The sha256 of the file at `path` and the identity of the file read,
/// taken from the open file before reading (a write while it is read moves
/// the change time: the identity then names no file with those bytes).
fn hash_file(path: &Path) -> std::io::Result<(String, FileId)> {
    let mut file = File::open(path)?;
    let id = FileId::of(&file.metadata()?);
    Ok((knit_os::digest::sha256_read(&mut file)?, id))
}

/// A manifest path must stay inside the package: plain relative components.
fn safe_relative(rel: &str) -> bool {
    !rel.is_empty()
        && Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Checks every listed file against its sha256; returns the identity of
/// each file hashed. `Err` is the reason (the first failing file in the
/// manifest's order).
pub fn verify_files(
    dir: &Path,
    files: &BTreeMap<String, String>,
) -> std::result::Result<Verified, String> {
    if !files.contains_key("bin/kubelet") {
        return Err("the manifest lists no bin/kubelet".to_string());
    }
    if let Some(rel) = files.keys().find(|rel| !safe_relative(rel)) {
        return Err(format!("manifest path {rel:?} leaves the package"));
    }
    let hashed = hash_all(dir, files);
    let mut verified = Verified::new();
    for ((rel, want), result) in files.iter().zip(hashed) {
        let (got, id) = result.map_err(|e| format!("{rel}: {e}"))?;
        if !got.eq_ignore_ascii_case(want) {
            return Err(format!("{rel}: sha256 {got}, manifest says {want}"));
        }
        verified.insert(rel.clone(), id);
    }
    Ok(verified)
}

/// At most this many files hashed at once.
const HASH_THREADS: usize = 4;

/// The sha256 and identity of every listed file, in the manifest's order.
/// Hashing is most of checking a package (107 MiB for 1.31.4, about 1 GB/s
/// a core with SHA-NI): one thread per CPU this process may use (its
/// affinity and cgroup quota), each taking the largest file left. On 2
/// cores it halved the phase on an idle host and was no slower with three
/// nodes at once (docs/benchmarks.md, bench/agent/preloaded-components.sh).
fn hash_all(
    dir: &Path,
    files: &BTreeMap<String, String>,
) -> Vec<std::io::Result<(String, FileId)>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let paths: Vec<PathBuf> = files.keys().map(|rel| dir.join(rel)).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(HASH_THREADS)
        .min(paths.len());
    if threads <= 1 {
        return paths.iter().map(|p| hash_file(p)).collect();
    }
    // Largest first, so that no thread is left with a big file at the end.
    let mut order: Vec<usize> = (0..paths.len()).collect();
    order
        .sort_by_cached_key(|&i| std::cmp::Reverse(fs::metadata(&paths[i]).map_or(0, |m| m.len())));
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<std::io::Result<(String, FileId)>>> =
        paths.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        done.push((i, hash_file(&paths[i])));
                    }
                    done
                })
            })
            .collect();
        for worker in workers {
            // A worker that panicked leaves its files unhashed: failed below.
            for (i, result) in worker.join().unwrap_or_default() {
                results[i] = Some(result);
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(std::io::Error::other("not hashed"))))
        .collect()
}

/// The cache's node-absolute directory for a data-disk mount target.
pub fn cache_dir(mount_target: &str) -> String {
    format!("{}/{CACHE_SUBDIR}", mount_target.trim_end_matches('/'))
}

/// A valid cache of `version`, or the reason it cannot be used.
pub fn check_cache(
    host: &Host,
    cache_abs: &str,
    version: &str,
) -> std::result::Result<Package, String> {
    let dir = host.path(cache_abs);
    if !dir.is_dir() {
        return Err(format!("no cache at {cache_abs}"));
    }
    let manifest_path = dir.join(CACHE_MANIFEST);
    if !manifest_path.exists() && dir.join(PACKAGE_MANIFEST).exists() {
        return check_hand_made_cache(&dir, cache_abs, version);
    }
    let cache = read_cache_manifest(&dir, cache_abs, version)?;
    verified_cache(dir, cache, Source::Cache)
}

/// `knit-cache.json` of the cache at `cache_abs`, if it holds `version`.
fn read_cache_manifest(
    dir: &Path,
    cache_abs: &str,
    version: &str,
) -> std::result::Result<CacheManifest, String> {
    let text = fs::read_to_string(dir.join(CACHE_MANIFEST)).map_err(|e| {
        format!(
            "cannot read {cache_abs}/{CACHE_MANIFEST} (and no {PACKAGE_MANIFEST}, so the \
             version cannot be told): {e}"
        )
    })?;
    let cache: CacheManifest = serde_json::from_str(&text)
        .map_err(|e| format!("{cache_abs}/{CACHE_MANIFEST} is corrupt: {e}"))?;
    if cache.version != version {
        return Err(format!(
            "cache holds version {}, this node wants {version}",
            cache.version
        ));
    }
    Ok(cache)
}

/// The cache's package once every file matches its sha256.
fn verified_cache(
    dir: PathBuf,
    cache: CacheManifest,
    source: Source,
) -> std::result::Result<Package, String> {
    let verified = verify_files(&dir, &cache.files).map_err(|e| format!("cache corrupt: {e}"))?;
    Ok(Package {
        dir,
        manifest: PackageManifest {
            version: cache.version,
            containerd_version: None,
            files: cache.files,
        },
        tarball_sha256: cache.tarball_sha256,
        source,
        verified,
    })
}

/// Where a node image holds a preloaded package (`knit image preload`): a
/// cache like the data disk's, read-only in the image, its binaries
/// already installed beside it.
pub const PRELOAD_DIR: &str = "/opt/knit/kubernetes";

/// Whether the node image holds a preloaded package at all.
pub fn has_preloaded(host: &Host) -> bool {
    host.path(PRELOAD_DIR).join(CACHE_MANIFEST).is_file()
}

/// Whether the cache at `cache_abs` says it holds `version` made from the
/// tarball `tarball_sha256` (its manifest only: nothing hashed).
pub fn cache_holds(host: &Host, cache_abs: &str, version: &str, tarball_sha256: &str) -> bool {
    !tarball_sha256.is_empty()
        && read_cache_manifest(&host.path(cache_abs), cache_abs, version)
            .is_ok_and(|c| c.tarball_sha256.eq_ignore_ascii_case(tarball_sha256))
}

/// The package preloaded in the node image, if it is `version` and, when
/// the config names the tarball's sha256, made from that tarball (an image
/// preloaded from another build of the same version is not used).
pub fn check_preloaded(
    host: &Host,
    version: &str,
    want_sha256: Option<&str>,
) -> std::result::Result<Package, String> {
    let dir = host.path(PRELOAD_DIR);
    let cache = read_cache_manifest(&dir, PRELOAD_DIR, version)?;
    if let Some(want) = want_sha256 {
        if !cache.tarball_sha256.eq_ignore_ascii_case(want) {
            return Err(format!(
                "the image's preloaded package ({PRELOAD_DIR}) was made from a tarball with sha256 {}, this node wants {want}",
                cache.tarball_sha256
            ));
        }
    }
    verified_cache(dir, cache, Source::Preloaded)
}

/// A cache made by hand with the seed's procedure (`tar -xf` the package,
/// `mv pkg/kubernetes <mount>/ack/`): no `knit-cache.json`, but the
/// package's own `knit-package.json` came along. What it says is checked:
/// the version, and every listed file present with its sha256. (The
/// tarball's digest is unknown: the cache is trusted as far as its files
/// match the manifest that came with them.)
fn check_hand_made_cache(
    dir: &Path,
    cache_abs: &str,
    version: &str,
) -> std::result::Result<Package, String> {
    let text = fs::read_to_string(dir.join(PACKAGE_MANIFEST)).map_err(|e| {
        format!("hand-made cache (no {CACHE_MANIFEST}): cannot read {cache_abs}/{PACKAGE_MANIFEST}: {e}")
    })?;
    let manifest: PackageManifest = serde_json::from_str(&text).map_err(|e| {
        format!(
            "hand-made cache (no {CACHE_MANIFEST}): {cache_abs}/{PACKAGE_MANIFEST} is corrupt: {e}"
        )
    })?;
    if manifest.version != version {
        return Err(format!(
            "hand-made cache (no {CACHE_MANIFEST}) holds version {}, this node wants {version}",
            manifest.version
        ));
    }
    let verified = verify_files(dir, &manifest.files)
        .map_err(|e| format!("hand-made cache (no {CACHE_MANIFEST}) corrupt: {e}"))?;
    Ok(Package {
        dir: dir.to_path_buf(),
        manifest,
        tarball_sha256: String::new(),
        source: Source::HandMadeCache,
        verified,
    })
}

/// Reads and checks `knit-package.json` of an unpacked package.
fn read_unpacked(
    dir: &Path,
    version: &str,
    source: Source,
    tarball_sha256: String,
) -> Result<Package> {
    let manifest_path = dir.join(PACKAGE_MANIFEST);
    let text = fs::read_to_string(&manifest_path)
        .context(ErrorCode::FailGetKubeVersion, || {
            format!("cannot get the Kubernetes version of package {source}: no readable {PACKAGE_PREFIX}/{PACKAGE_MANIFEST}")
        })?;
    let manifest: PackageManifest =
        serde_json::from_str(&text).context(ErrorCode::FailGetKubeVersion, || {
            format!(
                "cannot get the Kubernetes version: {} is not a valid package manifest",
                manifest_path.display()
            )
        })?;
    if manifest.version != version {
        return Err(AgentError::new(
            ErrorCode::FailGetKubeVersion,
            format!(
                "package {source} holds Kubernetes {}, kubernetes.version is {version}",
                manifest.version
            ),
        ));
    }
    let verified = verify_files(dir, &manifest.files).map_err(|reason| {
        AgentError::new(
            ErrorCode::FailChecksumMismatch,
            format!("package {source}: {reason}; nothing installed"),
        )
    })?;
    Ok(Package {
        dir: dir.to_path_buf(),
        manifest,
        tarball_sha256,
        source,
        verified,
    })
}

/// Unpacks `pkg/kubernetes/` of a tarball into `dest` (emptied first).
/// Entries outside `pkg/kubernetes/`, or leaving it, are ignored or refused.
pub fn unpack(tarball: &Path, dest: &Path) -> Result<()> {
    let fail = |what: String| AgentError::new(ErrorCode::FailInstallComponents, what);
    let _ = fs::remove_dir_all(dest);
    fs::create_dir_all(dest).map_err(|e| fail(format!("create {}: {e}", dest.display())))?;
    let file = File::open(tarball).map_err(|e| fail(format!("open {}: {e}", tarball.display())))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let entries = archive
        .entries()
        .map_err(|e| fail(format!("read {}: {e}", tarball.display())))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| fail(format!("read {}: {e}", tarball.display())))?;
        let path = entry
            .path()
            .map_err(|e| fail(format!("{}: bad entry name: {e}", tarball.display())))?
            .into_owned();
        let path = path.strip_prefix(".").unwrap_or(&path);
        let Ok(rel) = path.strip_prefix(PACKAGE_PREFIX) else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(fail(format!(
                "{}: entry {} leaves {PACKAGE_PREFIX}/",
                tarball.display(),
                path.display()
            )));
        }
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir()) {
            // Links could point anywhere: the package holds plain files only.
            continue;
        }
        let target = dest.join(rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| fail(format!("create {}: {e}", parent.display())))?;
        }
        entry
            .unpack(&target)
            .map_err(|e| fail(format!("unpack {}: {e}", target.display())))?;
    }
    Ok(())
}

/// The tarball's URL from `kubernetes.url` (a full URL or a directory).
pub fn tarball_url(package: &KubernetesPackage, url: &str) -> String {
    if url.ends_with(".tar.gz") || url.ends_with(".tgz") {
        url.to_string()
    } else {
        format!("{}/{}", url.trim_end_matches('/'), package.tarball_name())
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The first word of a `.sha256` sidecar (`<hex>` or `<hex>  <name>`).
fn parse_sidecar(text: &str) -> Option<String> {
    let word = text.split_whitespace().next()?;
    is_sha256(word).then(|| word.to_lowercase())
}

fn transient(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::Status(code, _) => *code >= 500 || *code == 408 || *code == 429,
        ureq::Error::Transport(_) => true,
    }
}

/// Downloads `url` into `dest`, hashing as it streams. Returns (bytes, sha256).
fn fetch(
    agent: &ureq::Agent,
    url: &str,
    dest: &Path,
) -> std::result::Result<(u64, String), (bool, String)> {
    let response = agent
        .get(url)
        .call()
        .map_err(|e| (transient(&e), e.to_string()))?;
    let mut reader = response.into_reader();
    let mut file =
        File::create(dest).map_err(|e| (false, format!("create {}: {e}", dest.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| (true, format!("reading the body after {bytes} bytes: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| (false, format!("write {}: {e}", dest.display())))?;
        bytes += n as u64;
    }
    file.sync_all()
        .map_err(|e| (false, format!("fsync {}: {e}", dest.display())))?;
    Ok((bytes, hex::encode(hasher.finalize())))
}

/// The expected digest: `kubernetes.sha256`, else the `.sha256` sidecar.
fn expected_sha256(
    host: &Host,
    agent: &ureq::Agent,
    package: &KubernetesPackage,
    url: &str,
) -> Result<String> {
    if let Some(sha) = &package.sha256 {
        return Ok(sha.to_lowercase());
    }
    let sidecar = format!("{url}.sha256");
    host.log.line(
        SCOPE,
        &format!("kubernetes.sha256 not set: fetching {sidecar}"),
    );
    let attempts = package.download_attempts.max(1) as u32;
    let mut attempt = 1;
    let text = loop {
        let result = agent
            .get(&sidecar)
            .call()
            .map_err(|e| (transient(&e), e.to_string()))
            .and_then(|r| r.into_string().map_err(|e| (true, e.to_string())));
        match result {
            Ok(text) => break text,
            Err((true, e)) if attempt < attempts => {
                host.log.line(
                    SCOPE,
                    &format!("fetch {sidecar} failed (attempt {attempt}/{attempts}): {e}"),
                );
                std::thread::sleep(Duration::from_secs(1 << (attempt - 1).min(4)));
                attempt += 1;
            }
            // The mirror answered, without the file: the digest is missing.
            Err((false, e)) => {
                return Err(AgentError::new(
                    ErrorCode::FailDownloadKubernetes,
                    format!(
                        "no checksum for {url}: kubernetes.sha256 is not set and {sidecar} could not be fetched ({e}); \
                         set kubernetes.sha256 or publish the .sha256 file beside the tarball"
                    ),
                ))
            }
            Err((true, e)) => {
                return Err(AgentError::new(
                    ErrorCode::FailDownloadKubernetes,
                    format!(
                        "cannot fetch {sidecar} ({attempts} attempt(s)): {e}; check kubernetes.url and that the node reaches the mirror"
                    ),
                ))
            }
        }
    };
    parse_sidecar(&text).ok_or_else(|| {
        AgentError::new(
            ErrorCode::FailDownloadKubernetes,
            format!("{sidecar} does not start with a sha256 hex digest"),
        )
    })
}

/// Downloads and verifies the tarball, then unpacks it into `unpack_to`.
pub fn download(
    host: &Host,
    package: &KubernetesPackage,
    url: &str,
    agent: &ureq::Agent,
    unpack_to: &Path,
) -> Result<Package> {
    let url = tarball_url(package, url);
    let expected = expected_sha256(host, agent, package, &url)?;
    let staging = host.path(STAGING_DIR);
    fs::create_dir_all(&staging).context(ErrorCode::FailDownloadKubernetes, || {
        format!("create {}", staging.display())
    })?;
    let tarball = staging.join(package.tarball_name());
    let attempts = package.download_attempts.max(1) as u32;
    let mut last_error = String::new();
    let mut downloaded = None;
    for attempt in 1..=attempts {
        host.log.line(
            SCOPE,
            &format!("download {url} (attempt {attempt}/{attempts})"),
        );
        match fetch(agent, &url, &tarball) {
            Ok(done) => {
                downloaded = Some(done);
                break;
            }
            Err((retry, e)) => {
                host.log.line(SCOPE, &format!("download {url} failed: {e}"));
                last_error = e;
                if !retry {
                    break;
                }
                if attempt < attempts {
                    std::thread::sleep(Duration::from_secs(1 << (attempt - 1).min(4)));
                }
            }
        }
    }
    let Some((bytes, got)) = downloaded else {
        let _ = fs::remove_file(&tarball);
        return Err(AgentError::new(
            ErrorCode::FailDownloadKubernetes,
            format!(
                "cannot download {url} ({attempts} attempt(s)): {last_error}; check kubernetes.url and that the node reaches the mirror"
            ),
        ));
    };
    if got != expected {
        let _ = fs::remove_file(&tarball);
        return Err(AgentError::new(
            ErrorCode::FailChecksumMismatch,
            format!("{url}: sha256 is {got}, expected {expected}; nothing installed"),
        ));
    }
    let source = Source::Download {
        url: url.clone(),
        bytes,
    };
    let unpacked = unpack(&tarball, unpack_to)
        .and_then(|()| read_unpacked(unpack_to, &package.version, source, got));
    let _ = fs::remove_file(&tarball);
    if unpacked.is_err() {
        let _ = fs::remove_dir_all(unpack_to);
    }
    unpacked
}

/// A package from `kubernetes.dir` (node-absolute): the tarball, or an
/// unpacked `pkg/kubernetes`. `None` when the directory holds neither.
pub fn from_dir(
    host: &Host,
    package: &KubernetesPackage,
    dir: &str,
    unpack_to: &Path,
) -> Result<Option<Package>> {
    let base = dir.trim_end_matches('/');
    let tarball_abs = format!("{base}/{}", package.tarball_name());
    let tarball = host.path(&tarball_abs);
    if tarball.is_file() {
        let got = sha256_file(&tarball).context(ErrorCode::FailInstallComponents, || {
            format!("read {tarball_abs}")
        })?;
        let sidecar = host.read(&format!("{tarball_abs}.sha256"));
        let expected = match (&package.sha256, sidecar) {
            (Some(sha), _) => Some(sha.to_lowercase()),
            (None, Some(text)) => Some(parse_sidecar(&text).ok_or_else(|| {
                AgentError::new(
                    ErrorCode::FailInstallComponents,
                    format!("{tarball_abs}.sha256 does not start with a sha256 hex digest"),
                )
            })?),
            (None, None) => None,
        };
        match expected {
            Some(want) if want != got => {
                return Err(AgentError::new(
                    ErrorCode::FailChecksumMismatch,
                    format!("{tarball_abs}: sha256 is {got}, expected {want}; nothing installed"),
                ))
            }
            Some(_) => {}
            None => host.log.line(
                SCOPE,
                &format!("no sha256 for {tarball_abs}: trusting the local directory (its files are still checked against {PACKAGE_MANIFEST})"),
            ),
        }
        unpack(&tarball, unpack_to)?;
        return read_unpacked(
            unpack_to,
            &package.version,
            Source::LocalTarball(tarball_abs),
            got,
        )
        .map(Some);
    }
    let unpacked_abs = format!("{base}/{PACKAGE_PREFIX}");
    let unpacked = host.path(&unpacked_abs);
    if unpacked.join(PACKAGE_MANIFEST).is_file() {
        return read_unpacked(
            &unpacked,
            &package.version,
            Source::LocalDir(unpacked_abs),
            String::new(),
        )
        .map(Some);
    }
    Ok(None)
}

/// Copies `src` (a directory tree of plain files) to `dest`.
fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dest)?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let to = dest.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &to)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

/// Adopts a hand-made cache that passed its checks: writes the
/// `knit-cache.json` it lacked (from the package's own manifest), so the
/// next reader (a snapshot build, a rerun) finds a regular cache.
pub fn adopt_hand_made_cache(package: &Package) -> Result<()> {
    let manifest = CacheManifest {
        version: package.manifest.version.clone(),
        tarball_sha256: String::new(),
        files: package.manifest.files.clone(),
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| {
        AgentError::new(
            ErrorCode::FailInstallComponents,
            format!("encode cache manifest: {e}"),
        )
    })?;
    crate::files::write_atomic(&package.dir.join(CACHE_MANIFEST), &text, 0o644)
}

/// Where a package being cached is assembled, beside the cache (same
/// filesystem, so it can be renamed into place). Node-absolute.
pub fn cache_staging(cache_abs: &str) -> String {
    let parent = cache_abs.rsplit_once('/').map_or("", |(p, _)| p);
    format!("{parent}/.kubernetes.knit-tmp")
}

/// Makes the package the data-disk cache, replacing any other version, and
/// returns the cache directory. The new cache appears whole or not at all: it
/// is assembled in `cache_staging` (where the package may already have been
/// unpacked), then renamed into place.
pub fn write_cache(host: &Host, cache_abs: &str, package: &Package) -> Result<PathBuf> {
    let dest = host.path(cache_abs);
    let fail = |what: String| AgentError::new(ErrorCode::FailInstallComponents, what);
    let tmp = host.path(&cache_staging(cache_abs));
    let old = tmp.with_file_name(".kubernetes.knit-old");
    let _ = fs::remove_dir_all(&old);
    if package.dir != tmp {
        let _ = fs::remove_dir_all(&tmp);
        copy_tree(&package.dir, &tmp)
            .map_err(|e| fail(format!("copy the package to {}: {e}", tmp.display())))?;
    }
    let manifest = CacheManifest {
        version: package.manifest.version.clone(),
        tarball_sha256: package.tarball_sha256.clone(),
        files: package.manifest.files.clone(),
    };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| fail(format!("encode cache manifest: {e}")))?;
    crate::files::write_atomic(&tmp.join(CACHE_MANIFEST), &text, 0o644)?;
    if dest.exists() {
        fs::rename(&dest, &old).map_err(|e| fail(format!("move aside {}: {e}", dest.display())))?;
    }
    fs::rename(&tmp, &dest).map_err(|e| fail(format!("rename into {}: {e}", dest.display())))?;
    let _ = fs::remove_dir_all(&old);
    Ok(dest)
}

/// Where each kind of executable in the package is installed: kubelet and
/// the runtime beside the system's, CNI plugins where containerd looks.
const INSTALL_DIRS: &[(&str, &str)] = &[("bin/", BIN_DIR), ("cni/bin/", CNI_BIN_DIR)];
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";

/// Installs every `bin/*` file of the package into `/usr/local/bin` and
/// every `cni/bin/*` into `/opt/cni/bin` (knit-os's durable write: copied
/// beside it, fsynced, renamed over it, so a running binary is replaced
/// atomically). A destination that already holds the file is left as it is
/// and not noted for undo: the very file this run verified (a preloaded
/// image's binaries are hard links to its cache), or one whose sha256 is
/// the manifest's (a preloaded image made by hand or before those links, a
/// rerun). Returns node-absolute path → sha256.
pub fn install_binaries(host: &Host, package: &Package) -> Result<BTreeMap<String, String>> {
    place_binaries(host, package, Target::Node)
}

/// Where the binaries are placed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A node: what is written is noted in its undo ledger.
    Node,
    /// A node image being made (`preload`): nothing noted (the ledger is
    /// each node's own), and each binary a hard link to the cache's file,
    /// so that a node hashes it once, as the cache's.
    Image,
}

fn place_binaries(
    host: &Host,
    package: &Package,
    target: Target,
) -> Result<BTreeMap<String, String>> {
    let fail = |what: String| AgentError::new(ErrorCode::FailInstallComponents, what);
    let mut installed = BTreeMap::new();
    for (rel, sha) in &package.manifest.files {
        let Some((dir, name)) = INSTALL_DIRS
            .iter()
            .find_map(|(prefix, dir)| rel.strip_prefix(prefix).map(|name| (*dir, name)))
        else {
            continue;
        };
        if name.contains('/') {
            continue;
        }
        let abs = format!("{dir}/{name}");
        let dest = host.path(&abs);
        let source = package.dir.join(rel);
        // The file this run hashed as `rel` (a preloaded image's cache file
        // and its installed binary are one inode): reading it again would
        // only hash the same bytes twice.
        if package.is_verified_file(rel, &dest) {
            installed.insert(abs, sha.clone());
            continue;
        }
        // Only a file this run hashed is linked: its bytes are the manifest's.
        if target == Target::Image && package.is_verified_file(rel, &source) {
            match link_binary(&source, &dest) {
                Ok(true) => {
                    installed.insert(abs, sha.clone());
                    continue;
                }
                Ok(false) => {}
                Err(e) => return Err(fail(format!("link {}: {e}", dest.display()))),
            }
        }
        // Reading it (from the image's shared page cache) is far cheaper
        // than writing it through this machine's disk.
        if sha256_file(&dest).is_ok_and(|got| got.eq_ignore_ascii_case(sha)) {
            installed.insert(abs, sha.clone());
            continue;
        }
        if target == Target::Node {
            host.ledger().note_dir(dir)?;
            host.ledger().note_file(&abs)?;
        }
        knit_os::durable::write_with(&dest, 0o755, |file| {
            std::io::copy(&mut File::open(&source)?, file).map(|_| ())
        })
        .map_err(|e| fail(format!("install {}: {e}", dest.display())))?;
        installed.insert(abs, sha.clone());
    }
    Ok(installed)
}

/// Puts a hard link to `source` at `dest` (made beside it, renamed over
/// it, the directory flushed). `false` when it cannot be one: `source` has
/// not the installed mode 0755, or the two are on different filesystems
/// (the caller copies instead).
fn link_binary(source: &Path, dest: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    if fs::metadata(source)?.permissions().mode() & 0o7777 != 0o755 {
        return Ok(false);
    }
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return Ok(false);
    };
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.knit-link", name.to_string_lossy()));
    let _ = fs::remove_file(&tmp);
    if fs::hard_link(source, &tmp).is_err() {
        return Ok(false);
    }
    if let Err(e) = fs::rename(&tmp, dest) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()?;
    Ok(true)
}

/// Where the agent itself is preloaded; the stub runs it when its sha256
/// is the one the control plane serves.
pub const PRELOADED_AGENT: &str = "/usr/local/bin/knit-agent";

/// What `preload` put into an image root.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preloaded {
    pub version: String,
    pub tarball_sha256: String,
    /// Node-absolute path → sha256 of every binary installed.
    pub binaries: BTreeMap<String, String>,
    pub agent_sha256: Option<String>,
}

/// Preloads a node image root (`host` rooted there, not a live machine):
/// the package's tarball verified, unpacked as a cache at [`PRELOAD_DIR`],
/// its binaries installed where the agent installs them, and `agent` (the
/// one the control plane serves) at [`PRELOADED_AGENT`]. Nodes on the
/// image then check and use these instead of downloading and writing
/// them, and share one copy in the host's page cache.
pub fn preload(
    host: &Host,
    tarball: &Path,
    version: &str,
    want_sha256: Option<&str>,
    agent: Option<&Path>,
) -> Result<Preloaded> {
    let got = sha256_file(tarball).context(ErrorCode::FailInstallComponents, || {
        format!("read {}", tarball.display())
    })?;
    if let Some(want) = want_sha256.filter(|w| !w.eq_ignore_ascii_case(&got)) {
        return Err(AgentError::new(
            ErrorCode::FailChecksumMismatch,
            format!(
                "{}: sha256 is {got}, expected {want}; nothing preloaded",
                tarball.display()
            ),
        ));
    }
    let staging = host.path(&cache_staging(PRELOAD_DIR));
    unpack(tarball, &staging)?;
    let mut package = read_unpacked(
        &staging,
        version,
        Source::LocalTarball(tarball.display().to_string()),
        got.clone(),
    )?;
    package.dir = write_cache(host, PRELOAD_DIR, &package)?;
    let binaries = place_binaries(host, &package, Target::Image)?;
    let agent_sha256 = match agent {
        Some(agent) => {
            let dest = host.path(PRELOADED_AGENT);
            knit_os::durable::write_with(&dest, 0o755, |file| {
                std::io::copy(&mut File::open(agent)?, file).map(|_| ())
            })
            .map_err(|e| {
                AgentError::new(
                    ErrorCode::FailInstallComponents,
                    format!("preload {} as {}: {e}", agent.display(), dest.display()),
                )
            })?;
            Some(
                sha256_file(&dest).context(ErrorCode::FailInstallComponents, || {
                    format!("read {}", dest.display())
                })?,
            )
        }
        None => None,
    };
    Ok(Preloaded {
        version: package.manifest.version,
        tarball_sha256: got,
        binaries,
        agent_sha256,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarball_url_from_directory_or_file() {
        let p = KubernetesPackage::default();
        assert_eq!(
            tarball_url(&p, "http://m/k8s/"),
            format!("http://m/k8s/{}", p.tarball_name())
        );
        assert_eq!(tarball_url(&p, "http://m/x.tar.gz"), "http://m/x.tar.gz");
    }

    #[test]
    fn sidecar_parsing() {
        let hex = "a".repeat(64);
        assert_eq!(parse_sidecar(&format!("{hex}  k.tar.gz\n")), Some(hex));
        assert_eq!(parse_sidecar("nothex"), None);
    }

    /// Only the file that was hashed counts as verified: a hard link to it
    /// does, a copy with the same bytes, a symbolic link or the file after
    /// a write do not.
    #[test]
    fn a_verified_file_is_known_by_identity_only() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        fs::write(bin.join("kubelet"), b"kubelet").unwrap();
        // Linked before it is verified: a new link moves the change time.
        fs::hard_link(bin.join("kubelet"), dir.path().join("link")).unwrap();
        fs::copy(bin.join("kubelet"), dir.path().join("copy")).unwrap();
        std::os::unix::fs::symlink(bin.join("kubelet"), dir.path().join("symlink")).unwrap();
        let files = BTreeMap::from([(
            "bin/kubelet".to_string(),
            hex::encode(Sha256::digest(b"kubelet")),
        )]);
        let package = Package {
            dir: dir.path().to_path_buf(),
            manifest: PackageManifest {
                version: "1".into(),
                containerd_version: None,
                files: files.clone(),
            },
            tarball_sha256: String::new(),
            source: Source::Cache,
            verified: verify_files(dir.path(), &files).unwrap(),
        };
        let verified = |name: &str| package.is_verified_file("bin/kubelet", &dir.path().join(name));
        assert!(verified("bin/kubelet"));
        assert!(verified("link"));
        assert!(!verified("copy"));
        assert!(!verified("symlink"));
        assert!(!verified("missing"));
        assert!(!package.is_verified_file("bin/other", &bin.join("kubelet")));
        fs::write(dir.path().join("link"), b"tampered").unwrap();
        assert!(!verified("link"));
        assert!(!verified("bin/kubelet"));
    }

    /// Files are hashed on several threads; the failure named is still the
    /// first in the manifest's order.
    #[test]
    fn verification_names_the_first_failing_file() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        let sha = |data: &[u8]| hex::encode(Sha256::digest(data));
        let mut files = BTreeMap::new();
        for name in ["a", "kubelet", "m", "z"] {
            fs::write(bin.join(name), vec![name.as_bytes()[0]; 300_000]).unwrap();
            files.insert(
                format!("bin/{name}"),
                sha(&vec![name.as_bytes()[0]; 300_000]),
            );
        }
        let verified = verify_files(dir.path(), &files).unwrap();
        assert_eq!(verified.len(), 4);
        fs::remove_file(bin.join("z")).unwrap();
        fs::write(bin.join("m"), b"tampered").unwrap();
        let err = verify_files(dir.path(), &files).unwrap_err();
        assert!(err.starts_with("bin/m: sha256 "), "{err}");
        fs::write(bin.join("m"), vec![b'm'; 300_000]).unwrap();
        let err = verify_files(dir.path(), &files).unwrap_err();
        assert!(err.starts_with("bin/z: "), "{err}");
    }

    #[test]
    fn manifest_paths_must_stay_inside() {
        assert!(safe_relative("bin/kubelet"));
        assert!(!safe_relative("../etc/passwd"));
        assert!(!safe_relative("/etc/passwd"));
    }
}
