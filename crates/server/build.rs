// The built-in task templates and the dashboard's views and static files are embedded from the
// workspace's templates/ and web/ folders; rebuild when they change.
fn main() {
    println!("cargo:rerun-if-changed=../../templates");
    println!("cargo:rerun-if-changed=../../web");
}
