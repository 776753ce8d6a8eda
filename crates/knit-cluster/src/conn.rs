//! Connection admission shared by every listener of the process: knit's
//! API and web console, the embedded Kubernetes API and the autoscaler
//! service. Each listener has a [`Gate`] with a total limit and a limit per
//! client address; a connection over either is closed at once (never left
//! waiting in the backlog) and counted in `knit_connections_refused_total`.
//! The HTTP limits every listener applies to what it admits
//! ([`HttpLimits`]) and the descriptor budget ([`fit_descriptors`]) are
//! here too, so that no listener gets them wrong on its own.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The connection limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections open at once on the listener.
    pub max_connections: usize,
    /// Connections open at once from one client address (an IPv6 client
    /// is its /64: one host usually holds a whole /64).
    pub max_per_address: usize,
}

/// The HTTP limits of an admitted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// A TLS handshake not finished in this time closes the connection.
    pub handshake_timeout: Duration,
    /// HTTP/1.1: a request head not complete in this time (at the
    /// connection's start or between requests) closes the connection.
    pub header_timeout: Duration,
    /// HTTP/2: streams (requests) open at once on one connection; the
    /// client is told in SETTINGS and a stream over it is refused
    /// (RST_STREAM REFUSED_STREAM).
    pub http2_max_streams: u32,
    /// HTTP/2: a PING is sent after this long without a frame …
    pub http2_keepalive_interval: Duration,
    /// … and the connection closed when its answer does not come in this
    /// time (a peer that vanished, e.g. a deleted instance).
    pub http2_keepalive_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            http2_max_streams: DEFAULT_HTTP2_MAX_STREAMS,
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// Streams per HTTP/2 connection by default (Go's HTTP/2 server, and so
/// kube-apiserver's, allows 250).
pub const DEFAULT_HTTP2_MAX_STREAMS: u32 = 250;

/// Descriptors kept beside the listeners' connections for everything else
/// the process opens (datastore, files, child processes, outgoing calls).
pub const DESCRIPTOR_HEADROOM: u64 = 1024;

impl HttpLimits {
    /// A connection builder with these limits for a connection whose TLS
    /// handshake chose `alpn`: the protocol ALPN named is served alone (no
    /// sniffing of the first bytes, which waits with no timeout).
    pub fn builder(
        &self,
        alpn: Option<&[u8]>,
    ) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
        use hyper_util::rt::{TokioExecutor, TokioTimer};
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder = match alpn {
            Some(b"h2") => builder.http2_only(),
            Some(b"http/1.1") => builder.http1_only(),
            _ => builder,
        };
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.http2_max_streams.max(1))
            .keep_alive_interval(Some(self.http2_keepalive_interval))
            .keep_alive_timeout(self.http2_keepalive_timeout);
        builder
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener holds `max_connections`.
    Total,
    /// The client's address holds `max_per_address`.
    PerAddress,
}

impl Refused {
    /// The `limit` label of `knit_connections_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "total",
            Refused::PerAddress => "per_address",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    listener: &'static str,
    limit: &'static str,
}

/// The connection counters of every gate made with it (clones share
/// them): open connections, admitted and refused ones, by listener.
#[derive(Clone, Default, Debug)]
pub struct ConnectionMetrics {
    open: Family<ListenerLabel, Gauge>,
    accepted: Family<ListenerLabel, Counter>,
    refused: Family<RefusedLabels, Counter>,
}

impl ConnectionMetrics {
    /// Adds the counters to `registry` (as `knit_connections_open`,
    /// `knit_connections_accepted_total`, `knit_connections_refused_total`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "knit_connections_open",
            "Connections open, by listener",
            self.open.clone(),
        );
        registry.register(
            "knit_connections_accepted",
            "Connections admitted, by listener",
            self.accepted.clone(),
        );
        registry.register(
            "knit_connections_refused",
            "Connections closed at accept because the listener's total or the client address's limit was reached",
            self.refused.clone(),
        );
    }

    /// Refusals of `listener` for `why` so far.
    pub fn refused(&self, listener: &'static str, why: Refused) -> u64 {
        self.refused
            .get_or_create(&RefusedLabels {
                listener,
                limit: why.as_str(),
            })
            .get()
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// Admission to one listener (one gate may serve several sockets of the
/// same listener, e.g. the API on loopback and on the bridge).
pub struct Gate {
    listener: &'static str,
    limits: ListenerLimits,
    counts: Mutex<Counts>,
    metrics: ConnectionMetrics,
    /// When a refusal was last logged: one line per 10 s at most, so that
    /// a flood does not flood the log too.
    last_logged: Mutex<Option<Instant>>,
}

/// An admitted connection's place; given back when dropped.
pub struct Admission {
    gate: Arc<Gate>,
    key: IpAddr,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut c = self.gate.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_address.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                c.by_address.remove(&self.key);
            }
        }
        self.gate.gauge().dec();
    }
}

/// The key a client address is counted under: IPv4 (an IPv4-mapped IPv6
/// address too) as is, IPv6 by its /64.
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Gate {
    /// A gate named `listener` (the metrics' label) with `limits` (a limit
    /// of 0 is taken as 1: a listener that admits nothing is a mistake).
    pub fn new(
        listener: &'static str,
        limits: ListenerLimits,
        metrics: ConnectionMetrics,
    ) -> Arc<Gate> {
        let limits = ListenerLimits {
            max_connections: limits.max_connections.max(1),
            max_per_address: limits.max_per_address.max(1),
        };
        Arc::new(Gate {
            listener,
            limits,
            counts: Mutex::new(Counts::default()),
            metrics,
            last_logged: Mutex::new(None),
        })
    }

    pub fn limits(&self) -> ListenerLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts stay consistent even if a holder panicked.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gauge(&self) -> Gauge {
        self.metrics
            .open
            .get_or_create(&ListenerLabel {
                listener: self.listener,
            })
            .clone()
    }

    /// Admits a connection from `peer`, or says which limit refuses it
    /// (counted and, now and then, logged). The caller closes a refused
    /// connection at once.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admission, Refused> {
        let key = address_key(peer);
        let refused = {
            let mut c = self.lock();
            let from_peer = c.by_address.get(&key).copied().unwrap_or(0);
            if c.total >= self.limits.max_connections {
                Some(Refused::Total)
            } else if from_peer >= self.limits.max_per_address {
                Some(Refused::PerAddress)
            } else {
                c.total += 1;
                *c.by_address.entry(key).or_insert(0) += 1;
                None
            }
        };
        if let Some(why) = refused {
            self.metrics
                .refused
                .get_or_create(&RefusedLabels {
                    listener: self.listener,
                    limit: why.as_str(),
                })
                .inc();
            let mut last = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                *last = Some(Instant::now());
                let (limit, flag) = match why {
                    Refused::Total => (self.limits.max_connections, "total"),
                    Refused::PerAddress => (self.limits.max_per_address, "per client address"),
                };
                tracing::warn!(listener = self.listener, %peer, limit, "connection refused: the {flag} connection limit of this listener is reached (counted in knit_connections_refused_total; further refusals in the next 10 s are not logged)");
            }
            return Err(why);
        }
        self.metrics
            .accepted
            .get_or_create(&ListenerLabel {
                listener: self.listener,
            })
            .inc();
        self.gauge().inc();
        Ok(Admission {
            gate: self.clone(),
            key,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().total
    }
}

/// What [`fit_descriptors`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorBudget {
    /// The soft `RLIMIT_NOFILE` after raising it.
    pub soft: u64,
    /// The hard limit (the soft limit may not go above it).
    pub hard: u64,
    /// What the listeners' limits add up to, plus the headroom, as asked.
    pub wanted: u64,
    /// Whether the limits were lowered to fit.
    pub lowered: bool,
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, then
/// checks that the listeners' connection limits (`limits`, by name) plus
/// [`DESCRIPTOR_HEADROOM`] fit under it; when they do not, each limit is
/// lowered in proportion (to 1 at least) and a warning names the old and
/// new values. Without this, connections a limit would admit could take
/// descriptors the datastore and the providers need.
pub fn fit_descriptors(limits: &mut [(&str, &mut usize)]) -> std::io::Result<DescriptorBudget> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct given, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if rl.rlim_cur < rl.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: setrlimit reads the struct given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::debug!(
                from = rl.rlim_cur,
                to = rl.rlim_max,
                "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
            );
            rl.rlim_cur = rl.rlim_max;
        } else {
            tracing::warn!(soft = rl.rlim_cur, hard = rl.rlim_max, error = %std::io::Error::last_os_error(), "could not raise the open-file limit (RLIMIT_NOFILE)");
        }
    }
    let soft = rl.rlim_cur;
    let sum: u64 = limits
        .iter()
        .fold(0u64, |a, (_, n)| a.saturating_add(**n as u64));
    let wanted = sum.saturating_add(DESCRIPTOR_HEADROOM);
    let mut budget = DescriptorBudget {
        soft,
        hard: rl.rlim_max,
        wanted,
        lowered: false,
    };
    if wanted <= soft || sum == 0 {
        return Ok(budget);
    }
    let room = soft
        .saturating_sub(DESCRIPTOR_HEADROOM)
        .max(limits.len() as u64);
    let mut changes = Vec::new();
    for (name, n) in limits.iter_mut() {
        let old = **n;
        let new = ((old as u128 * room as u128) / sum as u128).max(1) as usize;
        **n = new;
        changes.push(format!("{name} {old} → {new}"));
    }
    budget.lowered = true;
    tracing::warn!(
        open_file_limit = soft,
        hard_limit = rl.rlim_max,
        wanted,
        "the open-file limit (RLIMIT_NOFILE {soft}) is below the listeners' connection limits plus {DESCRIPTOR_HEADROOM} descriptors of headroom ({wanted}): connection limits lowered to fit: {} (raise the hard limit, e.g. LimitNOFILE= in the systemd unit, or lower the --*max-connections flags)",
        changes.join(", ")
    );
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(total: usize, per: usize) -> (Arc<Gate>, ConnectionMetrics) {
        let m = ConnectionMetrics::default();
        let g = Gate::new(
            "test",
            ListenerLimits {
                max_connections: total,
                max_per_address: per,
            },
            m.clone(),
        );
        (g, m)
    }

    #[test]
    fn a_gate_refuses_over_either_limit_and_gives_places_back() {
        let (g, m) = gate(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = g.admit(a).unwrap();
        let _a2 = g.admit(a).unwrap();
        assert_eq!(g.admit(a).err(), Some(Refused::PerAddress));
        let _b1 = g.admit(b).unwrap();
        assert_eq!(g.admit(b).err(), Some(Refused::Total));
        assert_eq!(g.open(), 3);
        drop(a1);
        assert_eq!(g.open(), 2);
        let _b2 = g.admit(b).unwrap();
        assert_eq!(m.refused("test", Refused::PerAddress), 1);
        assert_eq!(m.refused("test", Refused::Total), 1);
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains("knit_connections_open{listener=\"test\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("knit_connections_refused_total{listener=\"test\",limit=\"total\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("knit_connections_accepted_total{listener=\"test\"} 4"),
            "{text}"
        );
    }

    #[test]
    fn ipv6_clients_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let (g, _) = gate(10, 1);
        let _x = g.admit("2001:db8:1:2::1".parse().unwrap()).unwrap();
        assert_eq!(
            g.admit("2001:db8:1:2:ffff::9".parse().unwrap()).err(),
            Some(Refused::PerAddress)
        );
        let _y = g.admit("2001:db8:1:3::1".parse().unwrap()).unwrap();
        let _v4 = g.admit("192.0.2.7".parse().unwrap()).unwrap();
        assert_eq!(
            g.admit("::ffff:192.0.2.7".parse().unwrap()).err(),
            Some(Refused::PerAddress)
        );
    }

    #[test]
    fn limits_over_the_descriptor_limit_are_lowered_in_proportion() {
        let mut api = usize::MAX / 4;
        let mut kube = usize::MAX / 4;
        let b = fit_descriptors(&mut [("api", &mut api), ("kube-api", &mut kube)]).unwrap();
        assert!(b.lowered);
        assert_eq!(b.soft, b.hard, "the soft limit is raised to the hard one");
        assert!(api >= 1 && kube >= 1);
        assert!((api + kube) as u64 + DESCRIPTOR_HEADROOM <= b.soft.max(DESCRIPTOR_HEADROOM + 2));
        assert_eq!(api, kube, "lowered in proportion");
        let mut small = 8;
        let b = fit_descriptors(&mut [("console", &mut small)]).unwrap();
        if b.soft >= 8 + DESCRIPTOR_HEADROOM {
            assert!(!b.lowered);
            assert_eq!(small, 8);
        }
    }
}
