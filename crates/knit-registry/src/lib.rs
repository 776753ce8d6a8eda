//! knit-registry: a real OCI registry for tests and benchmarks, with no
//! image from the internet.
//!
//! - [`Registry`] runs Debian's `docker-registry` (distribution 2.x) with its
//!   own storage directory and address; its log (with the HTTP access log)
//!   goes to a file the caller reads. Killed by PID when dropped. Writes
//!   only from the host, with a credential: the address it is started on
//!   is pull-only (the registry's read-only mode, no credential asked),
//!   and a writer on loopback over the same storage takes pushes from
//!   whoever shows the writer credential ([`writer_token`], HTTP basic
//!   auth; [`Registry::push_url`] carries it). A push without it is 401.
//! - [`build_image`] makes a Docker v2 image: layers of random
//!   (incompressible) bytes in a tar.gz each, an image config, a manifest.
//! - [`push`] uploads blobs (monolithic `POST` + `PUT ?digest=`) and the
//!   manifest through the registry HTTP API.
//! - [`oci`] builds the system images knit serves its nodes (a real pause
//!   process, stand-ins for the rest) into an OCI image layout, with no
//!   network, and reads that layout back for the control plane's registry.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub mod oci;

pub const MANIFEST_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const CONFIG_TYPE: &str = "application/vnd.docker.container.image.v1+json";
const LAYER_TYPE: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("I/O on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Start(String),
    #[error("registry HTTP: {0}")]
    Http(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// A file helper (knit-os).
    #[error("{0}")]
    Os(#[from] knit_os::OsError),
}

impl RegistryError {
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::Io { .. } => "RegistryIo",
            RegistryError::Start(_) => "RegistryStart",
            RegistryError::Http(_) => "RegistryHttp",
            RegistryError::Invalid(_) => "RegistryInvalid",
            RegistryError::Os(e) => e.code(),
        }
    }
}

pub type Result<T> = std::result::Result<T, RegistryError>;

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> RegistryError {
    let what = what.to_string();
    move |source| RegistryError::Io { what, source }
}

/// What a listener lets its clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Pull, push, delete: only ever on a loopback address (the host).
    ReadWrite,
    /// `GET`/`HEAD` only: docker-registry's read-only maintenance mode
    /// answers every push or delete with 405, and deletes are off.
    PullOnly,
}

/// The rule: writes only from the host. A listener on a loopback address
/// takes pushes; any other (a bridge address instances reach, every
/// address) serves pulls only, and pushes go to a second registry on
/// loopback over the same storage.
pub fn access_for(addr: &str) -> Access {
    let ip = addr
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| addr.parse::<std::net::IpAddr>());
    match ip {
        Ok(ip) if ip.is_loopback() => Access::ReadWrite,
        _ => Access::PullOnly,
    }
}

/// The user name of the loopback writer's credential.
pub const WRITER_USER: &str = "knit-writer";
/// `<dir>/writer-token`: the writer's password (mode 0600), made once.
pub const WRITER_TOKEN_FILE: &str = "writer-token";
/// `<dir>/writer.htpasswd`: its bcrypt hash, as docker-registry reads it.
const WRITER_HTPASSWD: &str = "writer.htpasswd";

/// The writer credential of the registry under `dir`: read from
/// `<dir>/writer-token`, or made (32 random bytes, hex) and written there
/// with mode 0600.
pub fn writer_token(dir: &Path) -> Result<String> {
    Ok(knit_os::durable::read_or_create_token(
        &dir.join(WRITER_TOKEN_FILE),
    )?)
}

/// `base` (`http://IP:PORT`) with the writer credential in it
/// (`http://knit-writer:TOKEN@IP:PORT`): HTTP clients send it as basic
/// auth.
pub fn credential_url(base: &str, token: &str) -> String {
    match base.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{WRITER_USER}:{token}@{rest}"),
        None => format!("http://{WRITER_USER}:{token}@{base}"),
    }
}

#[link(name = "crypt")]
extern "C" {
    // libxcrypt (Debian's libcrypt1): both allocate what they return.
    fn crypt_gensalt_ra(
        prefix: *const libc::c_char,
        count: libc::c_ulong,
        rbytes: *const libc::c_char,
        nrbytes: libc::c_int,
    ) -> *mut libc::c_char;
    fn crypt_ra(
        phrase: *const libc::c_char,
        setting: *const libc::c_char,
        data: *mut *mut libc::c_void,
        size: *mut libc::c_int,
    ) -> *mut libc::c_char;
}

/// The bcrypt hash of `password` (docker-registry's htpasswd takes bcrypt
/// only), by the system's libcrypt with a random salt.
fn bcrypt(password: &str) -> Result<String> {
    let fail =
        |what: &str| RegistryError::Start(format!("bcrypt of the writer credential: {what}"));
    let prefix = std::ffi::CString::new("$2b$").map_err(|_| fail("prefix"))?;
    let phrase = std::ffi::CString::new(password).map_err(|_| fail("a NUL in the password"))?;
    // SAFETY: a NUL-terminated prefix; NULL random bytes ask libcrypt to
    // get them itself. The result is malloc'd (freed below) or NULL.
    let salt = unsafe { crypt_gensalt_ra(prefix.as_ptr(), 10, std::ptr::null(), 0) };
    if salt.is_null() {
        return Err(fail(&std::io::Error::last_os_error().to_string()));
    }
    let mut data: *mut libc::c_void = std::ptr::null_mut();
    let mut size: libc::c_int = 0;
    // SAFETY: both strings NUL-terminated; crypt_ra allocates `data` (freed
    // below) and returns a pointer into it, or NULL.
    let hash = unsafe { crypt_ra(phrase.as_ptr(), salt, &mut data, &mut size) };
    let out = if hash.is_null() {
        None
    } else {
        // SAFETY: a NUL-terminated string inside `data`, copied before the free.
        Some(
            unsafe { std::ffi::CStr::from_ptr(hash) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    // SAFETY: both were allocated by libcrypt with malloc.
    unsafe {
        libc::free(salt.cast());
        libc::free(data);
    }
    match out {
        Some(h) if h.starts_with("$2b$") => Ok(h),
        _ => Err(fail("libcrypt gave no bcrypt hash")),
    }
}

/// A free `127.0.0.1:PORT` (the kernel's pick), for the loopback writer.
pub fn free_loopback_addr() -> Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("bind 127.0.0.1:0"))?;
    let addr = l.local_addr().map_err(io("bind 127.0.0.1:0"))?;
    Ok(addr.to_string())
}

/// The `docker-registry` binary and a config for `addr` with `access` and
/// storage under `dir` (written to `dir/config.yml` for the writer,
/// `dir/config-pull.yml` for a pull-only listener: both may serve the
/// same storage at once).
pub fn prepare(dir: &Path, addr: &str, access: Access) -> Result<(PathBuf, PathBuf)> {
    if access == Access::ReadWrite && access_for(addr) != Access::ReadWrite {
        return Err(RegistryError::Invalid(format!(
            "address {addr}: a registry that takes pushes listens on loopback only \
             (instances may only pull)"
        )));
    }
    let bin = ["/usr/bin/docker-registry", "/usr/local/bin/docker-registry"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            RegistryError::Start(
                "docker-registry is not installed (Debian package docker-registry: apt-get install docker-registry, or scripts/setup.sh --tests)"
                    .into(),
            )
        })?;
    let storage = dir.join("storage");
    std::fs::create_dir_all(&storage).map_err(io(storage.display()))?;
    // The writer asks for its credential (basic auth against a bcrypt
    // htpasswd): loopback is the host's, but not every process on it is.
    let mut auth = String::new();
    if access == Access::ReadWrite {
        use std::os::unix::fs::OpenOptionsExt;
        let token = writer_token(dir)?;
        let path = dir.join(WRITER_HTPASSWD);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io(path.display()))?;
        f.write_all(format!("{WRITER_USER}:{}\n", bcrypt(&token)?).as_bytes())
            .map_err(io(path.display()))?;
        auth = format!(
            "auth:\n  htpasswd:\n    realm: knit-registry-writer\n    path: {}\n",
            path.display()
        );
    }
    let (config, storage_mode) = match access {
        Access::ReadWrite => (dir.join("config.yml"), "  delete:\n    enabled: true\n"),
        // No upload purging either: uploads in progress are the writer's.
        Access::PullOnly => (
            dir.join("config-pull.yml"),
            "  delete:\n    enabled: false\n  maintenance:\n    uploadpurging:\n      enabled: false\n    readonly:\n      enabled: true\n",
        ),
    };
    // The access log is on: tests count blob and manifest requests.
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n{storage_mode}{auth}\
             http:\n  addr: {addr}\n",
            storage.display()
        ),
    )
    .map_err(io(config.display()))?;
    Ok((bin, config))
}

/// Waits until `/v2/` answers at `url`, or the process exits, or 30 s.
fn wait_answers(url: &str, child: &mut Child, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if answers(url) {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(RegistryError::Start(format!(
                "docker-registry exited ({st}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )));
        }
        if Instant::now() > deadline {
            return Err(RegistryError::Start(format!(
                "docker-registry did not answer at {url} within 30s: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A running `docker-registry`: a pull-only one on its address and a
/// writer on loopback that asks for the writer credential, one storage;
/// both stopped (by PID) when dropped.
pub struct Registry {
    children: Vec<Child>,
    addr: String,
    push_addr: String,
    token: String,
    log: PathBuf,
}

impl Registry {
    /// Starts the registry on `addr` (`IP:PORT`) with storage and log under
    /// `dir`, and waits until `/v2/` answers. It serves pulls only there (no
    /// credential asked, loopback included); [`Registry::push_url`] is a
    /// second listener on loopback that takes pushes with the writer
    /// credential.
    pub fn start(dir: &Path, addr: &str) -> Result<Registry> {
        let log = dir.join("registry.log");
        std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
        // Both processes append to one log (O_APPEND: lines do not mix).
        let out = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&log)
            .map_err(io(log.display()))?;
        drop(out);
        let mut reg = Registry {
            children: Vec::new(),
            addr: addr.to_string(),
            push_addr: free_loopback_addr()?,
            token: writer_token(dir)?,
            log,
        };
        let listeners = [
            (addr.to_string(), Access::PullOnly),
            (reg.push_addr.clone(), Access::ReadWrite),
        ];
        for (at, access) in listeners {
            let (bin, config) = prepare(dir, &at, access)?;
            let out = std::fs::OpenOptions::new()
                .append(true)
                .open(&reg.log)
                .map_err(io(reg.log.display()))?;
            let err = out.try_clone().map_err(io(reg.log.display()))?;
            let child = Command::new(bin)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(io("spawn docker-registry"))?;
            reg.children.push(child);
            let url = format!("http://{at}");
            if let Some(c) = reg.children.last_mut() {
                wait_answers(&url, c, &reg.log)?;
            }
        }
        Ok(reg)
    }

    /// Where clients pull (the address it was started on).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where the host pushes: loopback, with the writer credential in the
    /// URL (`http://knit-writer:TOKEN@127.0.0.1:PORT`).
    pub fn push_url(&self) -> String {
        credential_url(&format!("http://{}", self.push_addr), &self.token)
    }

    /// The writer without its credential (a push there is 401).
    pub fn push_url_without_credential(&self) -> String {
        format!("http://{}", self.push_addr)
    }

    /// The PID of the registry serving [`Registry::addr`].
    pub fn pid(&self) -> Option<u32> {
        self.children.first().map(Child::id)
    }

    /// Every process it runs (the pull listener first).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Blob fetches (`GET /v2/<repo>/blobs/…`) in the access log so far.
    pub fn blob_gets(&self) -> usize {
        count_blob_gets(&self.log_text())
    }

    pub fn stop(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Access-log lines (combined format) of `GET …/blobs/sha256:…`.
pub fn count_blob_gets(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/sha256:"))
        .count()
}

/// Access-log lines fetching a manifest (GET, not HEAD).
pub fn count_manifest_gets(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("\"GET /v2/") && l.contains("/manifests/"))
        .count()
}

/// A blob on disk with its digest.
#[derive(Debug, Clone)]
pub struct Blob {
    pub path: PathBuf,
    pub digest: String,
    pub size: u64,
}

/// An image ready to push.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub layers: Vec<Blob>,
    pub config: Blob,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
}

impl BuiltImage {
    /// Compressed bytes a pull transfers (config + layers).
    pub fn transfer_bytes(&self) -> u64 {
        self.config.size + self.layers.iter().map(|l| l.size).sum::<u64>()
    }
}

/// splitmix64: fast, and its output does not compress.
struct Noise(u64);

impl Noise {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let b = z.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

/// Hashes what goes through it.
struct HashWriter<W: Write> {
    inner: W,
    hash: Sha256,
    n: u64,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Random bytes of a given length, as a reader.
struct NoiseReader {
    noise: Noise,
    left: u64,
}

impl Read for NoiseReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        self.noise.fill(&mut buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

fn seed_of(s: &str) -> u64 {
    let d = Sha256::digest(s.as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// One layer: a tar holding `data/<name>` of `size` random bytes, gzipped.
/// Returns the blob and the diff id (sha256 of the tar).
fn build_layer(dir: &Path, name: &str, size: u64, seed: u64) -> Result<(Blob, String)> {
    // Named by its digest, known only once written: a temporary file in
    // `dir` (removed if building fails), made durable under that name.
    let file = tempfile::NamedTempFile::new_in(dir).map_err(io(dir.display()))?;
    let tmp = file.path().to_path_buf();
    let gz_out = HashWriter {
        inner: std::io::BufWriter::new(file),
        hash: Sha256::new(),
        n: 0,
    };
    // Level 1: the data is random, more effort would gain nothing.
    let gz = flate2::write::GzEncoder::new(gz_out, flate2::Compression::fast());
    let tar_out = HashWriter {
        inner: gz,
        hash: Sha256::new(),
        n: 0,
    };
    let mut builder = tar::Builder::new(tar_out);
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    let reader = NoiseReader {
        noise: Noise(seed),
        left: size,
    };
    builder
        .append_data(&mut header, format!("data/{name}"), reader)
        .map_err(io(tmp.display()))?;
    let tar_out = builder.into_inner().map_err(io(tmp.display()))?;
    let diff_id = format!("sha256:{}", hex::encode(tar_out.hash.finalize()));
    let gz_out = tar_out.inner.finish().map_err(io(tmp.display()))?;
    let digest = format!("sha256:{}", hex::encode(gz_out.hash.finalize()));
    let size = gz_out.n;
    let file = gz_out
        .inner
        .into_inner()
        .map_err(|e| io(tmp.display())(e.into_error()))?;
    let path = dir.join(digest.replace(':', "-"));
    knit_os::durable::persist(file, &path)?;
    Ok((Blob { path, digest, size }, diff_id))
}

fn write_blob(dir: &Path, data: &[u8]) -> Result<Blob> {
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(data)));
    let path = dir.join(digest.replace(':', "-"));
    knit_os::durable::write(&path, data, 0o644)?;
    Ok(Blob {
        path,
        digest,
        size: data.len() as u64,
    })
}

/// Builds `reference` (used as the random seed, so each image differs) with
/// `layers` layers of `layer_bytes` random bytes each, under `dir`.
pub fn build_image(
    dir: &Path,
    reference: &str,
    layers: usize,
    layer_bytes: u64,
) -> Result<BuiltImage> {
    if layers == 0 {
        return Err(RegistryError::Invalid(format!(
            "{reference}: an image needs at least one layer"
        )));
    }
    std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
    let mut blobs = Vec::new();
    let mut diff_ids = Vec::new();
    for i in 0..layers {
        let (blob, diff) = build_layer(
            dir,
            &format!("layer-{i}"),
            layer_bytes,
            seed_of(&format!("{reference}#{i}")),
        )?;
        blobs.push(blob);
        diff_ids.push(diff);
    }
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Labels": {"dev.knit.test-image": reference}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [],
    });
    let config = write_blob(dir, config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "size": config.size, "digest": config.digest},
        "layers": blobs.iter().map(|b| serde_json::json!({
            "mediaType": LAYER_TYPE, "size": b.size, "digest": b.digest
        })).collect::<Vec<_>>(),
    })
    .to_string()
    .into_bytes();
    let manifest_digest = format!("sha256:{}", hex::encode(Sha256::digest(&manifest)));
    Ok(BuiltImage {
        layers: blobs,
        config,
        manifest,
        manifest_digest,
    })
}

/// `repo:tag` → (repo, tag); a registry host prefix is dropped, so
/// `registry.k8s.io/pause:3.10` is stored as `pause:3.10` (what a mirror
/// is asked for).
pub fn split_reference(reference: &str) -> Result<(String, String)> {
    let (name, tag) = reference
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .ok_or_else(|| RegistryError::Invalid(format!("{reference}: expected repo:tag")))?;
    let repo = match name.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => {
            rest
        }
        _ => name,
    };
    if repo.is_empty() || tag.is_empty() {
        return Err(RegistryError::Invalid(format!(
            "{reference}: empty repository or tag"
        )));
    }
    Ok((repo.to_string(), tag.to_string()))
}

fn http_err(what: &str, e: ureq::Error) -> RegistryError {
    match e {
        ureq::Error::Status(code, r) => RegistryError::Http(format!(
            "{what}: HTTP {code}: {}",
            r.into_string().unwrap_or_default()
        )),
        other => RegistryError::Http(format!("{what}: {other}")),
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(5))
        .timeout(Duration::from_secs(600))
        .build()
}

fn push_blob(a: &ureq::Agent, base: &str, repo: &str, blob: &Blob) -> Result<()> {
    let head = a
        .head(&format!("{base}/v2/{repo}/blobs/{}", blob.digest))
        .call();
    if head.is_ok() {
        return Ok(());
    }
    let what = format!("upload {} to {repo}", blob.digest);
    let r = a
        .post(&format!("{base}/v2/{repo}/blobs/uploads/"))
        .send_bytes(&[])
        .map_err(|e| http_err(&what, e))?;
    let location = r
        .header("Location")
        .ok_or_else(|| RegistryError::Http(format!("{what}: no Location header")))?
        .to_string();
    // The upload's URL on the same registry, with the same credential (an
    // absolute Location names the host without it).
    let url = match location.split_once("://") {
        Some((_, rest)) => {
            let path = rest.find('/').map_or("", |i| &rest[i..]);
            format!("{base}{path}")
        }
        None => format!("{base}{location}"),
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let file = std::fs::File::open(&blob.path).map_err(io(blob.path.display()))?;
    a.put(&format!("{url}{sep}digest={}", blob.digest))
        .set("Content-Type", "application/octet-stream")
        .set("Content-Length", &blob.size.to_string())
        .send(file)
        .map_err(|e| http_err(&what, e))?;
    Ok(())
}

/// Pushes `image` as `reference` (host prefix dropped, see
/// [`split_reference`]) to the registry at `base` (`http://IP:PORT`).
pub fn push(base: &str, reference: &str, image: &BuiltImage) -> Result<()> {
    let (repo, tag) = split_reference(reference)?;
    let a = agent();
    for blob in image.layers.iter().chain(std::iter::once(&image.config)) {
        push_blob(&a, base, &repo, blob)?;
    }
    a.put(&format!("{base}/v2/{repo}/manifests/{tag}"))
        .set("Content-Type", MANIFEST_TYPE)
        .send_bytes(&image.manifest)
        .map_err(|e| http_err(&format!("put manifest {repo}:{tag}"), e))?;
    Ok(())
}

/// The digest the registry serves for `reference`.
pub fn manifest_digest(base: &str, reference: &str) -> Result<String> {
    let (repo, tag) = split_reference(reference)?;
    let r = agent()
        .head(&format!("{base}/v2/{repo}/manifests/{tag}"))
        .set("Accept", MANIFEST_TYPE)
        .call()
        .map_err(|e| http_err(&format!("head manifest {repo}:{tag}"), e))?;
    r.header("Docker-Content-Digest")
        .map(str::to_string)
        .ok_or_else(|| RegistryError::Http(format!("{reference}: no Docker-Content-Digest")))
}

/// Whether a registry answers `GET /v2/` at `base` (`http://IP:PORT`): 200,
/// or 401 from a writer asked without its credential.
pub fn answers(base: &str) -> bool {
    match ureq::get(&format!("{base}/v2/"))
        .timeout(Duration::from_secs(2))
        .call()
    {
        Ok(_) => true,
        Err(ureq::Error::Status(401, _)) => true,
        Err(_) => false,
    }
}

/// The repositories the registry at `base` holds (`GET /v2/_catalog`).
pub fn catalog(base: &str) -> Result<Vec<String>> {
    let text = agent()
        .get(&format!("{base}/v2/_catalog?n=1000"))
        .call()
        .map_err(|e| http_err("catalog", e))?
        .into_string()
        .map_err(io("read the catalog"))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RegistryError::Http(format!("catalog {text:?}: {e}")))?;
    Ok(v["repositories"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect())
}

/// Builds and pushes one image; the blobs are deleted afterwards.
pub fn seed(
    base: &str,
    work: &Path,
    reference: &str,
    layers: usize,
    layer_bytes: u64,
) -> Result<BuiltImage> {
    let dir = work.join(seed_of(reference).to_string());
    let image = build_image(&dir, reference, layers, layer_bytes)?;
    let pushed = push(base, reference, &image);
    let _ = std::fs::remove_dir_all(&dir);
    pushed.map(|()| image)
}

/// `NAME=SIZE[xLAYERS]` → (name, layers, bytes per layer); SIZE is bytes or
/// with a K/M/G suffix (powers of 1024) and split evenly across layers.
pub fn parse_image_arg(arg: &str) -> Result<(String, usize, u64)> {
    let (name, size) = arg
        .rsplit_once('=')
        .ok_or_else(|| RegistryError::Invalid(format!("{arg}: expected REF=SIZE[xLAYERS]")))?;
    let (size, layers) = match size.split_once('x') {
        Some((s, l)) => (
            s,
            l.parse::<usize>()
                .map_err(|_| RegistryError::Invalid(format!("{arg}: layers {l:?}")))?,
        ),
        None => (size, 1),
    };
    let (num, mult) = match size.chars().last() {
        Some('K') => (&size[..size.len() - 1], 1u64 << 10),
        Some('M') => (&size[..size.len() - 1], 1 << 20),
        Some('G') => (&size[..size.len() - 1], 1 << 30),
        _ => (size, 1),
    };
    let total = num
        .parse::<u64>()
        .map_err(|_| RegistryError::Invalid(format!("{arg}: size {size:?}")))?
        * mult;
    if layers == 0 || total == 0 {
        return Err(RegistryError::Invalid(format!(
            "{arg}: size and layers must be > 0"
        )));
    }
    Ok((name.to_string(), layers, total.div_ceil(layers as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_sizes() {
        assert_eq!(
            split_reference("registry.k8s.io/pause:3.10").unwrap(),
            ("pause".into(), "3.10".into())
        );
        assert_eq!(
            split_reference("docker.io/flannel/flannel:v0.26.1").unwrap(),
            ("flannel/flannel".into(), "v0.26.1".into())
        );
        assert_eq!(
            split_reference("knit/app:1").unwrap(),
            ("knit/app".into(), "1".into())
        );
        assert!(split_reference("localhost:5000/x").is_err());
        assert_eq!(
            parse_image_arg("knit/big:1=300Mx3").unwrap(),
            ("knit/big:1".into(), 3, 100 << 20)
        );
        assert!(parse_image_arg("x:1=0").is_err());
    }

    #[test]
    fn layers_are_incompressible_and_digests_match() {
        let dir = tempfile::tempdir().unwrap();
        let img = build_image(dir.path(), "t/x:1", 2, 256 << 10).unwrap();
        for l in &img.layers {
            // gzip of random bytes is not smaller than the bytes.
            assert!(l.size > 256 << 10, "{}", l.size);
            let data = std::fs::read(&l.path).unwrap();
            assert_eq!(
                format!("sha256:{}", hex::encode(Sha256::digest(&data))),
                l.digest
            );
        }
        assert_ne!(img.layers[0].digest, img.layers[1].digest);
        let m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
        assert_eq!(m["layers"].as_array().unwrap().len(), 2);
        assert_eq!(m["config"]["digest"], img.config.digest);
    }
}
