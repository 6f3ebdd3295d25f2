//! The model's library answers to the driver's soname, so a program linked
//! with `-lcuda` against it needs `libcuda.so.1`, as with the driver.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
