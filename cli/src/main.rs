//! The `tether` binary. Everything but the sandbox-init dispatch lives in [`tether_cli::commands`].

fn main() {
    // A sandbox's init is this binary re-executed; it must run before any thread or runtime.
    tether_local::run_if_sandbox_init();
    std::process::exit(tether_cli::commands::main());
}
