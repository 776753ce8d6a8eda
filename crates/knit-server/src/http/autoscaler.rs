//! `POST /api/v1/autoscaler/client-certificate`: a new client certificate
//! and key, signed by knit's CA, for cluster-autoscaler's externalgrpc
//! client (`knit autoscaler cloud-config` writes them and prints the
//! cloud-config naming them). Admin only; the key is made here and sent
//! once, over the API's TLS, never stored by the server.

use super::Cp;
use crate::error::{Result, ServerError};
use crate::pki::Pki;
use axum::extract::State;
use axum::Json;
use serde::Serialize;

/// What the CLI writes: the client's certificate and key, the CA that
/// signed them and the server's certificate, and where the service is.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificate {
    /// `HOST:PORT` of the autoscaler service (loopback when it listens on
    /// every address).
    pub address: String,
    pub certificate: String,
    pub key: String,
    pub ca: String,
}

pub async fn client_certificate(State(cp): State<Cp>) -> Result<Json<ClientCertificate>> {
    let Some(settings) = &cp.settings.autoscaler else {
        return Err(ServerError::Conflict(
            "the autoscaler service is off on this server (knit server --autoscaler-listen off): start it with --autoscaler-listen ADDRESS:PORT".to_string(),
        ));
    };
    let listen = settings.listen;
    let address = if listen.ip().is_unspecified() {
        format!("127.0.0.1:{}", listen.port())
    } else {
        listen.to_string()
    };
    let pki = Pki::load_or_create(&cp.settings.pki_dir(), &[cp.settings.admin_token_path()])?;
    let (certificate, key) = pki.client_certificate(crate::autoscaler::CLIENT_CN)?;
    cp.store.add_event(
        knit_api::state::EventType::Normal,
        "Autoscaler",
        "client-certificate",
        "Issued",
        "a cluster-autoscaler client certificate was issued (knit autoscaler cloud-config)",
    )?;
    Ok(Json(ClientCertificate {
        address,
        certificate,
        key,
        ca: cp.ca_pem.clone(),
    }))
}
