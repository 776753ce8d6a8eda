//! Generates the gRPC code of cluster-autoscaler's externalgrpc provider
//! (`proto/externalgrpc.proto`, served by `crate::autoscaler`) and the part
//! of Kubernetes' v1.Node its template node is written with
//! (`proto/k8s/*.proto`). The protos are compiled by protox, in Rust: the
//! build needs no protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/externalgrpc.proto",
        "proto/k8s/node.proto",
        "proto/k8s/meta.proto",
        "proto/k8s/resource.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        // Sorted maps: labels and quantities are written in key order, as
        // Kubernetes' own Marshal does.
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
