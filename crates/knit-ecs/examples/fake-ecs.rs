//! Runs the fake ECS on 127.0.0.1 until interrupted, to try
//! `knit server --provider ecs` without an account: prints the endpoint and
//! the environment the server needs (the fake's own made-up key). Ends,
//! cleaning up, on SIGINT or SIGTERM.

fn main() {
    let fake = knit_ecs::fake::FakeEcs::start();
    let c = fake.config();
    println!("export KNIT_ECS_ENDPOINT={}", fake.url());
    println!("export KNIT_ECS_REGION={}", c.region);
    println!("export ALIBABA_CLOUD_ACCESS_KEY_ID={}", c.access_key_id);
    println!(
        "export ALIBABA_CLOUD_ACCESS_KEY_SECRET={}",
        c.access_key_secret
    );
    if let Some((vsw, _)) = c.v_switches.iter().next() {
        println!("export KNIT_ECS_VSWITCH={vsw}");
    }
    if let Some((sg, _)) = c.security_groups.iter().next() {
        println!("export KNIT_ECS_SECURITY_GROUPS={sg}");
    }
    println!("export KNIT_ECS_IMAGE={}", c.images[0]);
    // Until SIGINT or SIGTERM; then the fake is dropped, which stops it and
    // removes its scratch directory (its instances' files).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the signals");
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    });
    drop(fake);
}
