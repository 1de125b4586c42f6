//! Driving the dashboard: over plain HTTP with a cookie jar ([`WebClient`]), and in a real
//! headless Chromium through ChromeDriver ([`Browser`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::StatusCode;

/// A browser session over plain HTTP: cookies kept, redirects not followed, so a test sees each
/// answer the server gives.
pub struct WebClient {
    base: String,
    http: reqwest::Client,
}

/// The value of the first hidden `csrf` input of a page.
pub fn csrf_of(html: &str) -> String {
    let re = regex::Regex::new(r#"name="csrf" value="([0-9a-f]+)""#).unwrap();
    re.captures(html).map(|c| c[1].to_string()).unwrap_or_else(|| panic!("no csrf field in the page:\n{html}"))
}

/// The compare page's chart (`data-compare` of `#compare-chart`) as JSON, unescaped from its
/// attribute; none when the page has no chart.
pub fn compare_chart_of(html: &str) -> Option<serde_json::Value> {
    let re = regex::Regex::new(r#"id="compare-chart" data-compare="([^"]*)""#).unwrap();
    let escaped = re.captures(html)?[1].to_string();
    let text = escaped
        .replace("&quot;", "\"")
        .replace("&#34;", "\"")
        .replace("&#x27;", "'")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).ok()
}

/// The points of run `id`'s line on a compare chart that have a value.
pub fn chart_points_of(chart: &serde_json::Value, id: &str) -> usize {
    chart["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["id"] == id)
        .flat_map(|s| s["values"].as_array().into_iter().flatten().filter(|v| !v.is_null()))
        .count()
}

impl WebClient {
    pub fn new(base: &str) -> WebClient {
        let http =
            reqwest::Client::builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap();
        WebClient { base: base.to_string(), http }
    }

    /// Signs in with an API token, as the sign-in form does; panics if that fails.
    pub async fn signed_in(base: &str, token: &str) -> WebClient {
        let client = WebClient::new(base);
        let (_, page) = client.get("/login").await;
        let (status, body) = client.post_form("/login", &[("csrf", &csrf_of(&page)), ("token", token)]).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "sign-in failed: {body}");
        client
    }

    /// The client itself, with the session's cookies (and no redirects followed).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let response = self.http.get(format!("{}{path}", self.base)).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    /// The status and `Location` of a GET that redirects (a download button).
    pub async fn redirect_of(&self, path: &str) -> (StatusCode, Option<String>) {
        let response = self.http.get(format!("{}{path}", self.base)).send().await.unwrap();
        let location = response.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_string);
        (response.status(), location)
    }

    pub async fn post_form(&self, path: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
        let response = self.http.post(format!("{}{path}", self.base)).form(form).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    /// The status and `Location` of a form post that redirects (to what it made).
    pub async fn post_form_location(&self, path: &str, form: &[(&str, &str)]) -> (StatusCode, Option<String>) {
        let response = self.http.post(format!("{}{path}", self.base)).form(form).send().await.unwrap();
        let location = response.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_string);
        (response.status(), location)
    }
}

/// Where the test run keeps files for people to look at (screenshots): not committed.
pub fn test_output_dir(what: &str) -> PathBuf {
    let root = std::env::var_os("TRAINYARD_TEST_OUTPUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-output"));
    let dir = root.join(what);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A browser, or `None` after printing why a browser test cannot run here (outside CI only:
/// in CI a missing browser fails the test), rather than passing silently.
pub async fn browser_or_skip(test: &str) -> Option<Browser> {
    match Browser::start().await {
        Ok(browser) => Some(browser),
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
        Err(why) => panic!("{test} needs a browser in CI: {why}"),
    }
}

/// Headless Chromium driven by ChromeDriver. Killed on drop.
pub struct Browser {
    pub client: Client,
    driver: Child,
}

impl Browser {
    /// Starts ChromeDriver and a browser, or says why not: `Err` carries the reason to print when
    /// the test is skipped (no ChromeDriver outside `tests/run`, which installs it).
    pub async fn start() -> Result<Browser, String> {
        let driver_path =
            std::env::var("TRAINYARD_TEST_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        if !std::path::Path::new(&driver_path).exists() {
            return Err(format!("no ChromeDriver at {driver_path}; tests/run installs chromium and chromium-driver"));
        }
        let port = free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot start {driver_path}: {err}"))?;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                // Root in a container has no user namespaces for Chromium's sandbox.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"]
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            // ChromeDriver listens on plain HTTP on this machine: no TLS connector needed.
            match ClientBuilder::new(HttpConnector::new()).capabilities(capabilities.clone()).connect(&url).await {
                Ok(client) => break client,
                Err(err) if Instant::now() > deadline => return Err(format!("ChromeDriver did not answer: {err}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        Ok(Browser { client, driver })
    }

    /// Signs in on the dashboard's sign-in page with `token`, as a person does, and waits for
    /// the page that greets its user (`user`).
    pub async fn sign_in(&self, base: &str, token: &str, user: &str) {
        self.client.goto(&format!("{base}/login")).await.unwrap();
        self.client.find(Locator::Id("token")).await.unwrap().send_keys(token).await.unwrap();
        self.client.find(Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
        self.wait_text("#who", Duration::from_secs(10), |t| t.contains(user)).await;
    }

    /// Waits until the element's text satisfies `ok`; panics with the last text after `timeout`.
    pub async fn wait_text(&self, css: &str, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(element) = self.client.find(Locator::Css(css)).await {
                last = element.text().await.unwrap_or_default();
                if ok(&last) {
                    return last;
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        panic!("{css} did not get there in {timeout:?}; its text was {last:?}");
    }

    /// Saves a PNG of the page at `width` pixels wide under the test output folder.
    pub async fn screenshot(&self, name: &str, width: u32) {
        self.client.set_window_size(width, 900).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let png = self.client.screenshot().await.unwrap();
        let path = test_output_dir("screenshots").join(format!("{name}-{width}.png"));
        std::fs::write(&path, png).unwrap();
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
