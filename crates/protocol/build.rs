// Records the target triple so a bundle can say which platform it carries.
fn main() {
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=AGENT_PLATFORM={target}");
}
