//! Sends phase events to the control plane. Reporting never fails a phase:
//! an event that cannot be delivered is kept and retried with the next one.

use crate::identity::NodeFacts;
use crate::tls;
use knit_api::{NodeConfig, PhaseEvent};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub struct Reporter {
    target: Option<(String, String, ureq::Agent)>,
    queue: Mutex<Queue>,
}

/// The events not yet delivered, oldest first, and whether a flush is
/// posting them. The lock is held only to change these, never across a
/// post: a report stuck on the network (up to the agent's timeout) must
/// not stall the phase that queues the next event.
#[derive(Default)]
struct Queue {
    pending: VecDeque<PhaseEvent>,
    /// One flush posts at a time, so events arrive in order; another
    /// flush leaves its events to it.
    flushing: bool,
}

impl Reporter {
    pub fn new(config: &NodeConfig, _node: &NodeFacts) -> Reporter {
        let target = match (&config.cluster.report_url, &config.cluster.report_token) {
            (Some(url), Some(token)) => {
                let agent = tls::http_agent(
                    config.cluster.control_plane_ca_cert.as_deref(),
                    Duration::from_secs(5),
                );
                match agent {
                    Ok(agent) => Some((url.clone(), token.clone(), agent)),
                    Err(e) => {
                        tracing::warn!("phase reports disabled: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        Reporter {
            target,
            queue: Mutex::new(Queue::default()),
        }
    }

    pub fn send(&self, event: PhaseEvent) {
        if self.target.is_none() {
            return;
        }
        self.lock().pending.push_back(event);
        self.flush();
    }

    /// Delivers queued events in order; stops at the first failure (the
    /// rest stay queued). Returns at once when another flush is posting:
    /// that one also delivers what was queued meanwhile.
    pub fn flush(&self) {
        let Some((url, token, agent)) = &self.target else {
            return;
        };
        {
            let mut queue = self.lock();
            if queue.flushing {
                return;
            }
            queue.flushing = true;
        }
        loop {
            let event = {
                let mut queue = self.lock();
                match queue.pending.front() {
                    Some(event) => event.clone(),
                    None => {
                        // Under the same lock as the check: an event queued
                        // after it finds no flush running and starts one.
                        queue.flushing = false;
                        return;
                    }
                }
            };
            // Posted without the lock.
            let result = agent
                .post(url)
                .set("Authorization", &format!("Bearer {token}"))
                .send_json(&event);
            let mut queue = self.lock();
            match result {
                // Only this flush removes events, so the front is still the
                // one just posted.
                Ok(_) => {
                    queue.pending.pop_front();
                }
                Err(e) => {
                    queue.flushing = false;
                    drop(queue);
                    tracing::warn!("cannot report phase event to {url}: {e}");
                    return;
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every change under the lock is one push, pop or flag: a panic
        // elsewhere leaves the queue whole.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::{PhaseName, PhaseOutcome};
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    fn event(node: &str) -> PhaseEvent {
        PhaseEvent {
            node: node.into(),
            instance_id: "i-1".into(),
            phase: PhaseName::TimeSync,
            outcome: PhaseOutcome::Done,
            reason: None,
            error_code: None,
            at_ms: 1,
            duration_ms: Some(1),
        }
    }

    /// One HTTP request's JSON body (by its Content-Length, at most 64 KiB).
    fn read_event(stream: &std::net::TcpStream) -> PhaseEvent {
        let mut reader = BufReader::new(stream);
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        assert!(length <= 64 * 1024, "a report of {length} bytes");
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// While a report hangs on the network, the next phase's event is
    /// queued without waiting for it (the lock is not held across the
    /// post), and both reach the server once, in order.
    #[test]
    fn an_event_is_queued_while_a_report_is_in_flight_and_all_arrive_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/report", listener.local_addr().unwrap());
        let (got_first, first_seen) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for i in 0..2 {
                let (mut stream, _) = listener.accept().unwrap();
                seen.push(read_event(&stream).node);
                if i == 0 {
                    // Holds the first report until the test says so.
                    got_first.send(()).unwrap();
                    released.recv().unwrap();
                }
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .unwrap();
            }
            seen
        });
        let agent = tls::http_agent(None, Duration::from_secs(5)).unwrap();
        let reporter = std::sync::Arc::new(Reporter {
            target: Some((url, "token".into(), agent)),
            queue: Mutex::new(Queue::default()),
        });
        let first = {
            let reporter = reporter.clone();
            std::thread::spawn(move || reporter.send(event("first")))
        };
        first_seen.recv().unwrap();
        // The first post is in flight and held: this returns at once, its
        // event left to the flush that is posting.
        reporter.send(event("second"));
        assert_eq!(reporter.lock().pending.len(), 2);
        release.send(()).unwrap();
        first.join().unwrap();
        assert_eq!(server.join().unwrap(), ["first", "second"]);
        let queue = reporter.lock();
        assert!(queue.pending.is_empty() && !queue.flushing);
    }
}
