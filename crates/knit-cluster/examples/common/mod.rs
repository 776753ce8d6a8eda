//! What the benchmarks of this directory share (each includes this file).

/// CPU seconds (user + system) of this process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The open-file limit raised to its hard limit: a thousand connections.
pub fn raise_fd_limit() {
    // SAFETY: get/setrlimit on our own process.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}
