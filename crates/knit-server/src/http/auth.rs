//! Who may call which route. Every route of the API (and of the console)
//! is added through [`Routes`], which takes the route's [`Access`] with
//! its handler: there is no way to add a route without declaring it, and
//! [`route_table`] lists them all (a test walks it). The API's routes and
//! their access are declared once, in `knit_api::routes` ([`Routes::api`]);
//! the console's pages are declared here, with `get`/`post`. The [`authorize`]
//! middleware reads the declaration of the route a request matched and
//! refuses a route it does not find (deny by default).

use super::Cp;
use crate::api_tokens;
use crate::error::ServerError;
use crate::pki;
use axum::extract::{MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter};
use axum::Router;
use knit_api::routes::{self, Route};
use std::sync::Arc;

/// What a route needs: declared with the API's routes in knit-api.
pub use knit_api::routes::Access;

/// One declared route: method, path as the router matches it (`:name`,
/// `*path`), and what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
}

/// A router under construction whose every route carries its access.
pub struct Routes<S> {
    paths: Vec<(&'static str, MethodRouter<S>)>,
    specs: Vec<RouteSpec>,
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Self {
        Routes {
            paths: Vec::new(),
            specs: Vec::new(),
        }
    }
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    /// `handler` for `method` on `path`, needing `access`.
    pub fn add<H, T>(
        mut self,
        method: Method,
        path: &'static str,
        access: Access,
        handler: H,
    ) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        // Only the methods below are ever passed (a constant per route).
        let filter = match method.as_str() {
            "POST" => MethodFilter::POST,
            "PUT" => MethodFilter::PUT,
            "DELETE" => MethodFilter::DELETE,
            // GET answers HEAD too (axum's `get`).
            _ => MethodFilter::GET,
        };
        let at = match self.paths.iter().position(|(p, _)| *p == path) {
            Some(at) => at,
            None => {
                self.paths.push((path, MethodRouter::new()));
                self.paths.len() - 1
            }
        };
        let routed = std::mem::take(&mut self.paths[at].1);
        self.paths[at].1 = routed.on(filter, handler);
        self.specs.push(RouteSpec {
            method,
            path,
            access,
        });
        self
    }

    /// `handler` for one of the API's routes, with the method, path and
    /// access `knit_api::routes` declares for it.
    pub fn api<H: Handler<T, S>, T: 'static>(self, route: Route, h: H) -> Self {
        let method = match route.method() {
            routes::Method::Get => Method::GET,
            routes::Method::Post => Method::POST,
            routes::Method::Put => Method::PUT,
            routes::Method::Delete => Method::DELETE,
        };
        self.add(method, route.path(), route.access(), h)
    }

    pub fn get<H: Handler<T, S>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        h: H,
    ) -> Self {
        self.add(Method::GET, path, access, h)
    }
    pub fn post<H: Handler<T, S>, T: 'static>(
        self,
        path: &'static str,
        access: Access,
        h: H,
    ) -> Self {
        self.add(Method::POST, path, access, h)
    }

    /// The router and the declarations of its routes.
    pub fn finish(self) -> (Router<S>, Vec<RouteSpec>) {
        let mut router = Router::new();
        for (path, routed) in self.paths {
            router = router.route(path, routed);
        }
        (router, self.specs)
    }
}

/// The declarations a request's (method, matched path) is looked up in.
#[derive(Clone)]
pub struct Table(Arc<Vec<RouteSpec>>);

impl Table {
    pub fn new(specs: &[RouteSpec]) -> Table {
        Table(Arc::new(specs.to_vec()))
    }

    /// The access of the route `request` matched.
    pub fn access_of(&self, request: &Request) -> Declared {
        let Some(path) = request.extensions().get::<MatchedPath>() else {
            return Declared::Nothing;
        };
        let path = path.as_str();
        let method = match *request.method() {
            Method::HEAD => Method::GET,
            ref m => m.clone(),
        };
        let mut path_known = false;
        for spec in self.0.iter().filter(|s| s.path == path) {
            if spec.method == method {
                return Declared::Access(spec.access);
            }
            path_known = true;
        }
        if path_known {
            Declared::OtherMethods
        } else {
            Declared::Nothing
        }
    }
}

/// What the route table says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// The route and method are declared with this access.
    Access(Access),
    /// The path is declared for other methods only: the builder registered
    /// no handler for this one, so the router answers 405 itself.
    OtherMethods,
    /// Neither: a route added past the builder, never served.
    Nothing,
}

/// Who made a request (an API token), for the handlers that want it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: String,
}

/// The API's gate: the route's declared access decides, a route without
/// one is refused.
pub async fn authorize(
    State((cp, table)): State<(Cp, Table)>,
    mut request: Request,
    next: Next,
) -> Response {
    let what = format!(
        "{} {}",
        request.method(),
        request
            .extensions()
            .get::<MatchedPath>()
            .map_or("?", |p| p.as_str())
    );
    let access = match table.access_of(&request) {
        Declared::Access(access) => access,
        Declared::OtherMethods => return next.run(request).await,
        Declared::Nothing => {
            return ServerError::Forbidden(format!(
                "{what} declares no access (a route added without a role is never served)"
            ))
            .into_response()
        }
    };
    let refusal = match access {
        Access::Public | Access::NodeToken(_) => return next.run(request).await,
        Access::Metrics => {
            let token = super::bearer(request.headers());
            let reader = cp.metrics.reader_token();
            if let (Some(t), Some(r)) = (token, reader) {
                if pki::secrets_equal(t, r) {
                    return next.run(request).await;
                }
            }
            match api_tokens::authenticate(&cp, token) {
                Ok(t) => {
                    request.extensions_mut().insert(Caller { token_id: t.id });
                    return next.run(request).await;
                }
                Err(ServerError::Unauthorized(why)) => ServerError::Unauthorized(format!(
                    "{why} (or the metrics reader token, the state directory's metrics-token)"
                )),
                Err(e) => e,
            }
        }
        Access::Role(needs) => {
            match api_tokens::authenticate(&cp, super::bearer(request.headers()))
                .and_then(|t| api_tokens::require(&t, needs, &what).map(|()| t))
            {
                Ok(t) => {
                    request.extensions_mut().insert(Caller { token_id: t.id });
                    return next.run(request).await;
                }
                Err(e) => e,
            }
        }
    };
    // Read (and drop) a small body so the connection stays usable for the
    // client's next request; a large one just closes it.
    let _ = axum::body::to_bytes(request.into_body(), 64 * 1024).await;
    refusal.into_response()
}

/// Every route of the API with its access (what the router serves).
pub fn route_table() -> Vec<RouteSpec> {
    super::routes().finish().1
}
