// The built-in task templates are embedded from the workspace's templates/ folder; rebuild when
// they change.
fn main() {
    println!("cargo:rerun-if-changed=../../templates");
}
