//! Compiles the logger handed to plug-ins (a variadic C function).
fn main() {
    println!("cargo:rerun-if-changed=src/logger.c");
    cc::Build::new()
        .file("src/logger.c")
        .warnings(true)
        .compile("rccl_plugin_logger");
}
