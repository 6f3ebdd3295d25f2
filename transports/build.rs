//! Compiles the logger handed to net plug-ins (a variadic C function).
fn main() {
    println!("cargo:rerun-if-changed=src/network/plugin/logger.c");
    cc::Build::new()
        .file("src/network/plugin/logger.c")
        .warnings(true)
        .compile("rccl_net_plugin_logger");
}
