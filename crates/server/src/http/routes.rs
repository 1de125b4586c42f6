//! The server's route table: every path it serves, recorded as the routers are built, so that
//! `trainyard routes` lists them all and the authorization coverage test
//! (`tests/e2e/authz.rs`) walks every one, every method, for every kind of caller. A route added
//! anywhere but through [`RouteTable::route`] would escape that test. The whole table is
//! [`crate::http::route_table`]: the API's routes and the dashboard's, merged.

use axum::Router;
use axum::routing::MethodRouter;

use crate::http::AppState;

/// A router and the paths it serves.
pub struct RouteTable {
    router: Router<AppState>,
    paths: Vec<&'static str>,
}

impl RouteTable {
    pub fn new() -> RouteTable {
        RouteTable { router: Router::new(), paths: Vec::new() }
    }

    pub fn route(mut self, path: &'static str, method_router: MethodRouter<AppState>) -> RouteTable {
        self.paths.push(path);
        self.router = self.router.route(path, method_router);
        self
    }

    pub fn merge(mut self, other: RouteTable) -> RouteTable {
        self.paths.extend(other.paths);
        self.router = self.router.merge(other.router);
        self
    }

    pub fn into_parts(self) -> (Router<AppState>, Vec<&'static str>) {
        (self.router, self.paths)
    }
}

impl Default for RouteTable {
    fn default() -> Self {
        RouteTable::new()
    }
}
