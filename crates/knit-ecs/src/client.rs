//! The one way knit talks to the ECS (and STS) OpenAPI: [`Client::call`].
//! Every request is signed (V3), bounded in time and answer size, and sent
//! again only where that is safe: a throttled request was never carried out;
//! a server error or a lost answer is repeated only for a read, an operation
//! that is idempotent by nature, or one carrying a `ClientToken`.

use crate::credentials::Credentials;
use crate::error::EcsError;
use crate::sign::{self, SignInput};
use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

pub type Params = BTreeMap<String, String>;

pub const ECS_VERSION: &str = "2014-05-26";
pub const STS_VERSION: &str = "2015-04-01";

/// Regions whose ECS host is not `ecs.<region>.aliyuncs.com`: the
/// exceptions of the official SDKs' endpoint map for ECS 2014-05-26 (the
/// generated clients' `EndpointMap`); cn-hangzhou is the one public region
/// among them.
const ECS_ENDPOINT_EXCEPTIONS: &[(&str, &str)] = &[
    ("cn-hangzhou", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-shanghai-finance-1", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-shenzhen-finance-1", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-north-2-gov-1", "ecs.aliyuncs.com"),
    ("ap-northeast-2-pop", "ecs.aliyuncs.com"),
    ("cn-beijing-finance-pop", "ecs.aliyuncs.com"),
    ("cn-beijing-gov-1", "ecs.aliyuncs.com"),
    ("cn-beijing-nu16-b01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-edge-1", "ecs.cn-qingdao-nebula.aliyuncs.com"),
    ("cn-fujian", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-haidian-cm12-c01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-hangzhou-bj-b01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-hangzhou-finance", "ecs.aliyuncs.com"),
    (
        "cn-hangzhou-internal-prod-1",
        "ecs-cn-hangzhou.aliyuncs.com",
    ),
    (
        "cn-hangzhou-internal-test-1",
        "ecs-cn-hangzhou.aliyuncs.com",
    ),
    (
        "cn-hangzhou-internal-test-2",
        "ecs-cn-hangzhou.aliyuncs.com",
    ),
    (
        "cn-hangzhou-internal-test-3",
        "ecs-cn-hangzhou.aliyuncs.com",
    ),
    ("cn-hangzhou-test-306", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-hongkong-finance-pop", "ecs.aliyuncs.com"),
    (
        "cn-huhehaote-nebula-1",
        "ecs.cn-qingdao-nebula.aliyuncs.com",
    ),
    ("cn-shanghai-et15-b01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-shanghai-et2-b01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-shanghai-inner", "ecs.aliyuncs.com"),
    (
        "cn-shanghai-internal-test-1",
        "ecs-cn-hangzhou.aliyuncs.com",
    ),
    ("cn-shenzhen-inner", "ecs.aliyuncs.com"),
    ("cn-shenzhen-st4-d01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-shenzhen-su18-b01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-wuhan", "ecs.aliyuncs.com"),
    ("cn-yushanfang", "ecs.aliyuncs.com"),
    ("cn-zhangbei", "ecs.aliyuncs.com"),
    ("cn-zhangbei-na61-b01", "ecs-cn-hangzhou.aliyuncs.com"),
    ("cn-zhangjiakou-na62-a01", "ecs.cn-zhangjiakou.aliyuncs.com"),
    (
        "cn-zhengzhou-nebula-1",
        "ecs.cn-qingdao-nebula.aliyuncs.com",
    ),
    ("eu-west-1-oxs", "ecs.cn-shenzhen-cloudstone.aliyuncs.com"),
    ("rus-west-1-pop", "ecs.aliyuncs.com"),
];

/// The public ECS endpoint of a region as the official SDKs resolve it:
/// the endpoint map's host where it names one (cn-hangzhou →
/// `ecs-cn-hangzhou.aliyuncs.com`), else the regional rule
/// `ecs.<region>.aliyuncs.com`.
pub fn ecs_endpoint(region: &str) -> String {
    match ECS_ENDPOINT_EXCEPTIONS.iter().find(|(r, _)| *r == region) {
        Some((_, host)) => format!("https://{host}"),
        None => format!("https://ecs.{region}.aliyuncs.com"),
    }
}

/// STS's regional endpoint.
pub fn sts_endpoint(region: &str) -> String {
    format!("https://sts.{region}.aliyuncs.com")
}

/// A region id as ECS spells them (`cn-shanghai`, `ap-southeast-1`).
pub fn check_region(region: &str) -> Result<(), EcsError> {
    let ok = !region.is_empty()
        && region.len() <= 64
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !region.starts_with('-')
        && !region.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(EcsError::Invalid(format!(
            "region {region:?}: must be an Alibaba Cloud region id such as cn-shanghai \
             (lower-case letters, digits and dashes)"
        )))
    }
}

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// No new attempt starts after this much time since the first.
    pub deadline: Duration,
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
            max_attempts: 8,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub region: String,
    /// `https://host[:port]` of the ECS API.
    pub ecs_endpoint: String,
    /// `https://host[:port]` of STS.
    pub sts_endpoint: String,
    /// Per request, connect to last byte.
    pub timeout: Duration,
    /// Largest answer body read.
    pub max_answer_bytes: usize,
    pub retry: RetryPolicy,
}

impl ClientConfig {
    /// The region's public endpoints, or `endpoint` (a private endpoint, a
    /// test's fake) for both ECS and STS.
    pub fn new(region: &str, endpoint: Option<&str>) -> Result<ClientConfig, EcsError> {
        check_region(region)?;
        let (ecs, sts) = match endpoint {
            Some(e) => {
                let e = e.trim_end_matches('/').to_string();
                if !(e.starts_with("https://") || e.starts_with("http://")) {
                    return Err(EcsError::Invalid(format!(
                        "ecs endpoint {e:?}: must be an http:// or https:// URL"
                    )));
                }
                (e.clone(), e)
            }
            None => (ecs_endpoint(region), sts_endpoint(region)),
        };
        Ok(ClientConfig {
            region: region.to_string(),
            ecs_endpoint: ecs,
            sts_endpoint: sts,
            timeout: Duration::from_secs(30),
            max_answer_bytes: 8 << 20,
            retry: RetryPolicy::default(),
        })
    }
}

/// Which API a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Ecs,
    Sts,
}

pub struct Client {
    config: ClientConfig,
    credentials: Credentials,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .field("credentials", &self.credentials)
            .finish()
    }
}

/// Operations that change nothing, or that end in the same state when
/// carried out twice (a second delete finds nothing, a second modify sets
/// the same values).
fn idempotent(action: &str, params: &Params) -> bool {
    action.starts_with("Describe")
        || action.starts_with("Get")
        || params.contains_key("ClientToken")
        || matches!(
            action,
            "ModifyInstanceAttribute" | "DeleteInstance" | "DeleteInstances" | "DeleteSnapshot"
        )
}

/// A random duration in `[0, max]`.
fn jitter(max: Duration) -> Duration {
    let mut b = [0u8; 8];
    let _ = getrandom::getrandom(&mut b);
    let nanos = max.as_nanos().min(u64::MAX as u128) as u64;
    Duration::from_nanos(u64::from_le_bytes(b) % nanos.saturating_add(1))
}

fn nonce() -> String {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // A nonce must be unique, not secret: time and a counter will do.
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = knit_os::time::OffsetDateTime::now_utc().unix_timestamp_nanos();
        return format!("{t:x}{n:x}");
    }
    hex::encode(b)
}

/// Now as ECS takes `x-acs-date`: `YYYY-MM-DDTHH:MM:SSZ` in UTC.
pub fn acs_date() -> String {
    knit_os::time::rfc3339_ms(knit_os::time::now_ms())
}

/// Seconds since the epoch of an [`acs_date`] (that form only: whole
/// seconds in UTC, as ECS takes `x-acs-date`).
pub fn parse_iso8601(s: &str) -> Option<i64> {
    if s.len() != 20 || !s.ends_with('Z') {
        return None;
    }
    knit_os::time::parse_rfc3339(s)
        .ok()
        .map(|t| t.unix_timestamp())
}

fn host_of(endpoint: &str) -> &str {
    let rest = endpoint
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or(endpoint);
    rest.split('/').next().unwrap_or(rest)
}

impl Client {
    pub fn new(config: ClientConfig, credentials: Credentials) -> Client {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(config.timeout.min(Duration::from_secs(10)))
            .timeout(config.timeout)
            .redirects(0)
            .build();
        Client {
            config,
            credentials,
            agent,
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub fn region(&self) -> &str {
        &self.config.region
    }

    /// An ECS action. `RegionId` is added when absent.
    pub fn call(&self, action: &str, params: Params) -> Result<serde_json::Value, EcsError> {
        self.call_service(Service::Ecs, action, params)
    }

    pub fn call_service(
        &self,
        service: Service,
        action: &str,
        mut params: Params,
    ) -> Result<serde_json::Value, EcsError> {
        if service == Service::Ecs {
            params
                .entry("RegionId".into())
                .or_insert_with(|| self.config.region.clone());
        }
        let policy = &self.config.retry;
        let started = Instant::now();
        let mut backoff = policy.first_backoff;
        let mut attempt = 1;
        loop {
            let outcome = self.once(service, action, &params);
            let err = match outcome {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let throttled =
                matches!(&err, EcsError::Api { code, .. } if code.starts_with("Throttling"));
            let may_repeat = err.is_retryable() && (throttled || idempotent(action, &params));
            if !may_repeat
                || attempt >= policy.max_attempts
                || started.elapsed() + backoff > policy.deadline
            {
                return Err(err);
            }
            // Half the backoff, plus a random part of the other half: clients
            // throttled together do not come back together.
            let wait = backoff / 2 + jitter(backoff / 2);
            tracing::info!(
                action,
                attempt,
                code = err.code(),
                backoff_ms = wait.as_millis() as u64,
                "ECS call failed, repeating it"
            );
            std::thread::sleep(wait);
            backoff = (backoff * 2).min(policy.max_backoff);
            attempt += 1;
        }
    }

    fn once(
        &self,
        service: Service,
        action: &str,
        params: &Params,
    ) -> Result<serde_json::Value, EcsError> {
        let (endpoint, version) = match service {
            Service::Ecs => (&self.config.ecs_endpoint, ECS_VERSION),
            Service::Sts => (&self.config.sts_endpoint, STS_VERSION),
        };
        let host = host_of(endpoint).to_string();
        // Every parameter goes in the query string and the body is empty,
        // as the official SDKs send ECS's and STS's RPC actions (each
        // parameter's metadata says `in: query`) and as the V3
        // specification's own RunInstances example does; the query string
        // is signed as the canonical query string. The URL therefore holds
        // passwords and user data: it is never logged or put in an error
        // (knit keeps ureq's own logging at warn, LOG_DIRECTIVE).
        let query = sign::canonical_query(params);
        let hashed = sign::sha256_hex(b"");
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        headers.insert("host".into(), host);
        headers.insert("x-acs-action".into(), action.to_string());
        headers.insert("x-acs-version".into(), version.to_string());
        headers.insert("x-acs-date".into(), acs_date());
        headers.insert("x-acs-signature-nonce".into(), nonce());
        headers.insert("x-acs-content-sha256".into(), hashed.clone());
        if let Some(token) = self.credentials.security_token() {
            // With an STS key the SDKs name the key id in a header too.
            headers.insert(
                "x-acs-accesskey-id".into(),
                self.credentials.access_key_id().to_string(),
            );
            headers.insert("x-acs-security-token".into(), token.to_string());
        }
        let input = SignInput {
            method: "POST",
            path: "/",
            query: params,
            headers: &headers,
            hashed_payload: &hashed,
        };
        let authorization = sign::authorization(
            &input,
            self.credentials.access_key_id(),
            self.credentials.secret(),
        );
        let url = if query.is_empty() {
            format!("{endpoint}/")
        } else {
            format!("{endpoint}/?{query}")
        };
        let mut request = self.agent.post(&url);
        for (k, v) in &headers {
            request = request.set(k, v);
        }
        request = request
            .set("Authorization", &authorization)
            .set("Accept", "application/json");
        let (status, response) = match request.send_bytes(&[]) {
            Ok(r) => (r.status(), r),
            Err(ureq::Error::Status(code, r)) => (code, r),
            Err(ureq::Error::Transport(t)) => {
                return Err(EcsError::Transport {
                    action: action.to_string(),
                    endpoint: endpoint.clone(),
                    reason: t.kind().to_string(),
                })
            }
        };
        // The gateway names the request in a header too: kept for an answer
        // whose body does not.
        let header_request_id = response
            .header("x-acs-request-id")
            .unwrap_or("")
            .to_string();
        let cap = self.config.max_answer_bytes;
        let mut body = Vec::new();
        response
            .into_reader()
            .take(cap as u64 + 1)
            .read_to_end(&mut body)
            .map_err(|e| EcsError::Transport {
                action: action.to_string(),
                endpoint: endpoint.clone(),
                reason: format!("reading the answer: {e}"),
            })?;
        if body.len() > cap {
            return Err(EcsError::Decode {
                action: action.to_string(),
                reason: format!("answer larger than {cap} bytes"),
            });
        }
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            if status >= 500 {
                // A gateway's HTML error page: a server error all the same.
                return EcsError::Api {
                    action: action.to_string(),
                    status,
                    code: "ServiceUnavailable".into(),
                    message: format!("HTTP {status} without a JSON body"),
                    request_id: header_request_id.clone(),
                };
            }
            EcsError::Decode {
                action: action.to_string(),
                reason: format!(
                    "HTTP {status}, body is not JSON (RequestId {header_request_id:?}): {e}"
                ),
            }
        })?;
        let request_id = value
            .get("RequestId")
            .and_then(|v| v.as_str())
            .filter(|r| !r.is_empty())
            .map(str::to_string)
            .unwrap_or(header_request_id);
        if (200..300).contains(&status) {
            tracing::debug!(action, request_id, "ECS call done");
            return Ok(value);
        }
        let text = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        Err(EcsError::Api {
            action: action.to_string(),
            status,
            code: text("Code"),
            message: text("Message"),
            request_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acs_dates_are_whole_utc_seconds_and_read_back_in_that_form_only() {
        let before = knit_os::time::now_secs() as i64;
        let now = acs_date();
        let t = parse_iso8601(&now).unwrap();
        assert!(
            (before..=knit_os::time::now_secs() as i64).contains(&t),
            "{now}"
        );
        assert_eq!(parse_iso8601("2026-12-02T08:12:09Z"), Some(1_796_199_129));
        assert_eq!(parse_iso8601("2026-12-02T08:12:09+00:00"), None);
        assert_eq!(parse_iso8601("2026-12-02T08:12:09.5Z"), None);
        assert_eq!(parse_iso8601("2026-13-02T08:12:09Z"), None);
    }

    #[test]
    fn endpoints_follow_the_sdk_map() {
        assert_eq!(
            ecs_endpoint("cn-hangzhou"),
            "https://ecs-cn-hangzhou.aliyuncs.com"
        );
        assert_eq!(
            ecs_endpoint("cn-shanghai"),
            "https://ecs.cn-shanghai.aliyuncs.com"
        );
        assert_eq!(
            ecs_endpoint("ap-southeast-1"),
            "https://ecs.ap-southeast-1.aliyuncs.com"
        );
        assert_eq!(
            ecs_endpoint("cn-shanghai-finance-1"),
            "https://ecs-cn-hangzhou.aliyuncs.com"
        );
        assert_eq!(
            sts_endpoint("cn-hangzhou"),
            "https://sts.cn-hangzhou.aliyuncs.com"
        );
    }
}
