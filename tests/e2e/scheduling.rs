//! Quotas, borrowing, reclaim and "why pending" through the real server, on the local executor
//! with simulated GPUs (this machine has none).

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

const GPU: &str = "sim-a100";

async fn gpu_job(env: &TestEnv, token: &str, name: &str, gpus: u32) -> String {
    let body =
        json!({"name": name, "command": ["sleep", "600"], "resources": {"gpus": gpus, "cpu": 0.1, "memory": "64Mi"}});
    let (status, job) = env.post("/api/v1/jobs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_str().unwrap().to_string()
}

async fn state(env: &TestEnv, token: &str, id: &str) -> Value {
    env.get(&format!("/api/v1/jobs/{id}"), token).await.1
}

async fn wait_running(env: &TestEnv, token: &str, id: &str) {
    env.wait_job_as(token, id, Duration::from_secs(30), |j| j["state"] == "running").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_tenants_borrow_reclaim_and_explain_their_queues() {
    let env = TestEnv::start_with(&["--simulate-gpus", "8", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    for team in ["team-a", "team-b"] {
        assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": team})).await.0, StatusCode::CREATED);
        let set = env.yard(&admin, &["admin", "tenant", "set", team, "--cohort", "lab"]);
        assert!(set.status.success(), "{}", stderr(&set));
        let quota = env.yard(&admin, &["admin", "quota", "set", team, GPU, "--nominal", "4"]);
        assert!(quota.status.success(), "{}", stderr(&quota));
    }
    let alice = env.member("team-a", "alice", "member").await;
    let bob = env.member("team-b", "bob", "member").await;

    // Bob bursts while Alice is idle: 4 jobs x 2 GPUs = his 4 plus 4 borrowed from Alice.
    let mut bobs = Vec::new();
    for i in 0..4 {
        bobs.push(gpu_job(&env, &bob, &format!("bob-{i}"), 2).await);
    }
    for id in &bobs {
        wait_running(&env, &bob, id).await;
    }
    let quota = env.yard(&bob, &["quota", "-o", "json"]);
    let quota: Value = serde_json::from_slice(&quota.stdout).unwrap();
    assert_eq!((quota["flavors"][0]["used"].as_u64(), quota["flavors"][0]["borrowed"].as_u64()), (Some(8), Some(4)));
    let (_, alice_quota) = env.get("/api/v1/quota", &alice).await;
    assert_eq!(alice_quota["flavors"][0]["lent"], 4);

    // Alice asks for her own 4: the two newest of Bob's jobs make way, back to his queue.
    let mine = gpu_job(&env, &alice, "alice-0", 4).await;
    wait_running(&env, &alice, &mine).await;
    // The preempted jobs are back in the queue once their processes have stopped.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let requeued = loop {
        let mut queued = Vec::new();
        for id in &bobs {
            if state(&env, &bob, id).await["state"] == "queued" {
                queued.push(id.clone());
            }
        }
        if queued.len() == 2 || std::time::Instant::now() > deadline {
            break queued;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for id in &bobs[..2] {
        let mut all = Vec::new();
        for b in &bobs {
            let (_, events) = env.get(&format!("/api/v1/jobs/{b}/events"), &bob).await;
            all.push(events.to_string());
        }
        assert_eq!(state(&env, &bob, id).await["state"], "running", "the older two keep running: {all:#?}");
    }
    assert_eq!(requeued, bobs[2..], "the newest two were preempted");
    let (_, events) = env.get(&format!("/api/v1/jobs/{}/events", requeued[0]), &bob).await;
    let last = events.as_array().unwrap().last().unwrap();
    assert_eq!((last["from_state"].as_str(), last["to_state"].as_str()), (Some("running"), Some("queued")));
    assert!(last["reason"].as_str().unwrap().contains("preempted to return borrowed quota"), "{last}");
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{}/attempts", requeued[0]), &bob).await;
    assert_eq!(attempts[0]["reason"].as_str().unwrap().split(' ').next(), Some("preempted"));

    // Why Bob's jobs wait, where they stand, and that the CLI says so.
    let (_, schedule) = env.get(&format!("/api/v1/jobs/{}/schedule", requeued[0]), &bob).await;
    assert_eq!(schedule["tenant_position"], 1);
    let reason = schedule["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("tenant quota for {GPU}: 4 of 4 GPUs in use, the cohort lends 0")), "{reason}");
    assert!(schedule["estimated_start"].is_string(), "an estimate from the running jobs' expected ends: {schedule}");
    let shown = env.yard(&bob, &["jobs", "show", &requeued[1]]);
    assert!(stdout(&shown).contains("position: 2 in your tenant's queue"), "{}", stdout(&shown));

    // What-if, for a new job of Bob's: it would queue third; nothing is submitted.
    let before = env.jobs_in_db().await;
    let what_if = env.yard(&bob, &["submit", "--gpus", "2", "--what-if", "--", "true"]);
    assert_eq!(what_if.status.code(), Some(3), "it would wait: {}", stderr(&what_if));
    assert!(stdout(&what_if).contains("position: 3 in your tenant's queue"), "{}", stdout(&what_if));
    let (_, answer) =
        env.post("/api/v1/templates/shell/jobs?what_if=true", &alice, &json!({"params": {"command": ["true"]}})).await;
    assert_eq!(answer["admitted_now"], true, "a CPU-only job of Alice's would start now: {answer}");
    assert_eq!(env.jobs_in_db().await, before);

    // Only platform admins set quotas, and bad values are named.
    let (status, _) = env
        .call(
            Method::PUT,
            &format!("/api/v1/admin/tenants/team-a/quotas/{GPU}"),
            Some(&bob),
            Some(&json!({"nominal": 99})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = env
        .call(Method::PUT, "/api/v1/admin/tenants/team-a/quotas/Bad Type", Some(&admin), Some(&json!({"nominal": 1})))
        .await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("flavor")));
    let (status, body) = env
        .call(
            Method::PUT,
            &format!("/api/v1/admin/tenants/team-a/quotas/{GPU}"),
            Some(&admin),
            Some(&json!({"nominal": -1})),
        )
        .await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("nominal")));
    let (status, _) = env
        .call(
            Method::PUT,
            &format!("/api/v1/admin/tenants/nobody/quotas/{GPU}"),
            Some(&admin),
            Some(&json!({"nominal": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A queue deeper than an admission cycle looks (500 jobs per tenant) still tells each job
/// where it stands; and the shared answer follows a change at once, not after its maximum age.
#[tokio::test(flavor = "multi_thread")]
async fn a_deep_queue_says_where_each_job_stands_and_answers_follow_changes() {
    let env = TestEnv::start_with(&["--simulate-gpus", "8", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": "deep"})).await.0, StatusCode::CREATED);
    let quota = env.yard(&admin, &["admin", "quota", "set", "deep", GPU, "--nominal", "2"]);
    assert!(quota.status.success(), "{}", stderr(&quota));
    let carol = env.member("deep", "carol", "member").await;

    // Carol's quota is full; then 505 more jobs queue behind it.
    let first = gpu_job(&env, &carol, "fills", 2).await;
    wait_running(&env, &carol, &first).await;
    let mut queued = Vec::new();
    for i in 0..505 {
        queued.push(gpu_job(&env, &carol, &format!("q-{i:03}"), 1).await);
    }
    // Submission order is id order (UUIDv7), which is the queue's order at equal priority.
    queued.sort();

    // The head: the scheduler's reason, positions and an estimate.
    let (_, head) = env.get(&format!("/api/v1/jobs/{}/schedule", queued[0]), &carol).await;
    assert_eq!(head["tenant_position"], 1, "{head}");
    assert!(
        head["reason"].as_str().unwrap().contains(&format!("tenant quota for {GPU}: 2 of 2 GPUs in use")),
        "{head}"
    );
    assert!(head["estimated_start"].is_string(), "{head}");
    // The reconciler keeps every waiting job's reason on the job itself, the tail's too (it
    // writes a pass's changed reasons in one statement).
    let wanted = head["reason"].clone();
    env.wait_job_as(&carol, &queued[0], Duration::from_secs(10), |j| j["reason"] == wanted).await;
    env.wait_job_as(&carol, &queued[499], Duration::from_secs(10), |j| j["reason"] == wanted).await;

    // The tail, deeper than a cycle looks: where it stands, and why there is no estimate.
    let (_, tail) = env.get(&format!("/api/v1/jobs/{}/schedule", queued[504]), &carol).await;
    assert_eq!(tail["tenant_position"], 505, "{tail}");
    let reason = tail["reason"].as_str().unwrap();
    assert!(reason.contains("waits behind 504 earlier queued jobs of its tenant"), "{reason}");
    assert!(reason.contains("considers the first 500"), "{reason}");
    assert!(tail["estimated_start"].is_null() && tail["cluster_position"].is_null(), "{tail}");

    // Cancelling the head moves the second job up at once (the answer is shared for up to two
    // seconds, but a change made through this server makes it recompute).
    let (_, second) = env.get(&format!("/api/v1/jobs/{}/schedule", queued[1]), &carol).await;
    assert_eq!(second["tenant_position"], 2, "{second}");
    let cancelled = env.yard(&carol, &["cancel", &queued[0]]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    let (_, second) = env.get(&format!("/api/v1/jobs/{}/schedule", queued[1]), &carol).await;
    assert_eq!(second["tenant_position"], 1, "{second}");
    let (_, tail) = env.get(&format!("/api/v1/jobs/{}/schedule", queued[504]), &carol).await;
    assert_eq!(tail["tenant_position"], 504, "{tail}");

    // 10,000 more of higher priority ahead of it: the count stops past 10,000 (it reads the
    // entries ahead, so a bound keeps it cheap however deep the queue) and says so.
    sqlx::query(
        "INSERT INTO jobs (id, tenant_id, name, spec, priority, last_actor, created_by)
         SELECT gen_random_uuid(), j.tenant_id, 'urgent-' || n, j.spec, 5, 'test', j.created_by
           FROM generate_series(1, 10000) n, (SELECT * FROM jobs WHERE id = $1::uuid) j",
    )
    .bind(&queued[504])
    .execute(&env.db.pool)
    .await
    .unwrap();
    let (_, tail) = env.get(&format!("/api/v1/jobs/{}/schedule", queued[504]), &carol).await;
    let reason = tail["reason"].as_str().unwrap();
    assert!(reason.contains("waits behind more than 10000 earlier queued jobs of its tenant"), "{reason}");
    assert!(tail["tenant_position"].is_null(), "{tail}");
    assert_eq!(tail["behind_higher_priority"], 10_000, "{tail}");
}

/// A job that can never run on the cluster as it is (8 simulated GPUs of one type, 8 cores) is
/// refused at submit with the field and the capacity named in human units, by the API, a
/// template run and what-if alike (`yard submit --what-if` exits 1 for it, 3 for a job that
/// would wait, 0 for one that would start now); a quota for a GPU type no node has is set with
/// a warning. Nothing is queued for the refused jobs.
#[tokio::test(flavor = "multi_thread")]
async fn jobs_that_can_never_fit_are_refused_with_the_capacity_named() {
    let env = TestEnv::start_with_fixed_cluster(&["--simulate-gpus", "8", "--simulate-gpu-type", "sim-gpu"]).await;
    let cases = [
        (
            json!({"command": ["true"], "resources": {"gpus": 16}}),
            "resources.gpus",
            "asks for 16 GPUs; the largest node has 8",
        ),
        (
            json!({"command": ["true"], "resources": {"gpus": 1, "gpu_type": "b200"}}),
            "resources.gpu_type",
            "no node of this cluster has GPUs of type b200 (its GPU types: sim-gpu)",
        ),
        (
            json!({"command": ["true"], "resources": {"cpu": 64}}),
            "resources.cpu",
            "asks for 64 CPUs; the largest node has 8 CPUs",
        ),
        (
            json!({"command": ["true"], "replicas": 2, "resources": {"gpus": 8}}),
            "replicas",
            "runs 2 replicas of 8 GPUs at once; the whole cluster holds at most 1",
        ),
    ];
    for (job, field, text) in &cases {
        let (status, body) = env.post("/api/v1/jobs", &env.admin_token, job).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{job}: {body}");
        assert_eq!(body["error"]["field"], *field, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("can never run on this cluster") && message.contains(text), "{message}");
        let (status, body) = env.post("/api/v1/jobs/what-if", &env.admin_token, job).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "what-if {job}: {body}");
    }
    let (status, body) = env
        .post("/api/v1/templates/shell/jobs", &env.admin_token, &json!({"params": {"command": ["true"], "cpu": 64}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(env.jobs_in_db().await, 0, "nothing was queued");

    // Without a quota, `yard quota` says so and which GPU types the cluster has, not an empty table.
    let none = stdout(&env.yard(&env.admin_token, &["quota"]));
    assert!(none.contains("no GPU quota yet") && none.contains("This cluster has sim-gpu."), "{none}");
    assert!(!none.contains("GPU TYPE"), "{none}");

    // The CLI's what-if: 1 never, 0 starts now, 3 would wait.
    let quota = json!({"nominal": 8});
    let (status, body) = env
        .call(Method::PUT, "/api/v1/admin/tenants/default/quotas/sim-gpu", Some(&env.admin_token), Some(&quota))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["warnings"], json!([]), "sim-gpu exists");
    let never = env.yard(&env.admin_token, &["submit", "--gpus", "16", "--what-if", "--", "true"]);
    assert_eq!(never.status.code(), Some(1), "{}", stderr(&never));
    assert!(stderr(&never).contains("the largest node has 8"), "{}", stderr(&never));
    let now = env.yard(&env.admin_token, &["submit", "--gpus", "8", "--what-if", "--", "true"]);
    assert_eq!(now.status.code(), Some(0), "{}", stderr(&now));
    let blocker = env.submit(json!({"command": ["sleep", "30"], "resources": {"gpus": 8}})).await;
    env.wait_state(&blocker, "running", Duration::from_secs(20)).await;
    let waits = env.yard(&env.admin_token, &["submit", "--gpus", "8", "--what-if", "--", "true"]);
    assert_eq!(waits.status.code(), Some(3), "{}{}", stdout(&waits), stderr(&waits));

    // A quota for a GPU type no node has (a typo, another spelling): refused, naming the
    // cluster's types and the way to set it anyway; nothing is stored.
    let (status, body) =
        env.call(Method::PUT, "/api/v1/admin/tenants/default/quotas/b200", Some(&env.admin_token), Some(&quota)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "flavor", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no node of this cluster has GPUs of type b200 (its GPU types: sim-gpu)"), "{message}");
    assert!(message.contains("--allow-unknown"), "{message}");
    let refused = env.yard(&env.admin_token, &["admin", "quota", "set", "default", "b200", "--nominal", "4"]);
    assert!(!refused.status.success() && stderr(&refused).contains("GPUs of type b200"), "{}", stderr(&refused));
    let (_, report) = env.get("/api/v1/quota", &env.admin_token).await;
    assert!(!report.to_string().contains("b200"), "nothing stored: {report}");
    // Allowed on purpose (nodes of it are about to join): set, with a warning (API and CLI).
    let allowed = json!({"nominal": 8, "allow_unknown": true});
    let (status, body) = env
        .call(Method::PUT, "/api/v1/admin/tenants/default/quotas/b200", Some(&env.admin_token), Some(&allowed))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["warnings"][0].as_str().unwrap().contains("no node of this cluster has GPUs of type b200"), "{body}");
    let set =
        env.yard(&env.admin_token, &["admin", "quota", "set", "default", "b200", "--nominal", "4", "--allow-unknown"]);
    assert!(set.status.success(), "{}", stderr(&set));
    assert!(stderr(&set).contains("warning: no node of this cluster has GPUs of type b200"));
}

/// On a cluster without GPUs (this machine's), `yard quota` says there are none and that jobs
/// without GPUs need no quota, rather than drawing an empty table; `-o json` is the report as is.
#[tokio::test(flavor = "multi_thread")]
async fn yard_quota_on_a_cluster_without_gpus_says_so() {
    let env = TestEnv::start().await;
    let out = env.yard(&env.admin_token, &["quota"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("no GPU quotas: this cluster has no GPUs"), "{text}");
    assert!(text.contains("Jobs without GPUs need no quota"), "{text}");
    assert!(!text.contains("GPU TYPE") && !text.contains('┌'), "no empty table: {text}");
    let json: Value = serde_json::from_slice(&env.yard(&env.admin_token, &["quota", "-o", "json"]).stdout).unwrap();
    assert_eq!(json["flavors"], json!([]), "{json}");
}

/// The queue: every waiting job a caller may see, in the scheduler's order with its reason and
/// position; members see their tenant's and a count of the others', platform admins all.
#[tokio::test(flavor = "multi_thread")]
async fn the_queue_shows_waiting_jobs_in_order_to_those_who_may_see_them() {
    let env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    for team in ["team-a", "team-b"] {
        assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": team})).await.0, StatusCode::CREATED);
        let quota = env.yard(&admin, &["admin", "quota", "set", team, GPU, "--nominal", "2"]);
        assert!(quota.status.success(), "{}", stderr(&quota));
    }
    let alice = env.member("team-a", "alice", "member").await;
    let bob = env.member("team-b", "bob", "member").await;
    let running = gpu_job(&env, &alice, "alice-running", 2).await;
    wait_running(&env, &alice, &running).await;
    let waiting_a = gpu_job(&env, &alice, "alice-waits", 2).await;
    let waiting_b = [gpu_job(&env, &bob, "bob-0", 2).await, gpu_job(&env, &bob, "bob-1", 2).await];
    wait_running(&env, &bob, &waiting_b[0]).await;

    let (status, queue) = env.get("/api/v1/queue", &alice).await;
    assert_eq!(status, StatusCode::OK, "{queue}");
    let as_of: chrono::DateTime<chrono::Utc> = queue["as_of"].as_str().unwrap().parse().unwrap();
    assert!((chrono::Utc::now() - as_of).num_seconds() < 10, "the standings' time: {queue}");
    let items = queue["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "alice sees her own waiting job only: {queue}");
    assert_eq!(items[0]["id"], waiting_a.as_str());
    assert!(items[0]["schedule"]["reason"].as_str().unwrap().contains("quota"), "{queue}");
    assert_eq!(queue["others_waiting"], 1, "bob's waiting job is counted, not shown");

    let (_, all) = env.get("/api/v1/queue", &admin).await;
    let names: Vec<&str> = all["items"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{all}");
    assert!(names.contains(&"alice-waits") && names.contains(&"bob-1"), "{names:?}");
    let positions: Vec<u64> =
        all["items"].as_array().unwrap().iter().map(|j| j["schedule"]["cluster_position"].as_u64().unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in the scheduler's order: {positions:?}");

    let table = env.yard(&alice, &["queue"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(text.contains("alice-waits") && text.contains(&waiting_a[..13]), "{text}");
    assert!(text.contains("(and 1 waiting jobs of other tenants)") && text.contains(" s ago)"), "{text}");
    assert!(!text.contains("bob-1"), "{text}");

    // The nodes those jobs hold: every tenant's running replicas counted, none named.
    let (status, nodes) = env.get("/api/v1/nodes", &alice).await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    let node = &nodes["items"][0];
    assert_eq!(nodes["items"].as_array().unwrap().len(), 1, "{nodes}");
    assert_eq!(node["gpu_type"], GPU);
    assert_eq!((node["gpus"].as_u64(), node["gpus_allocated"].as_u64()), (Some(4), Some(4)), "{nodes}");
    assert_eq!(node["replicas"], 2, "alice's and bob's running jobs: {nodes}");
    assert_eq!(node["cpu_millis_allocated"], 200);
    assert_eq!(node["memory_bytes_allocated"], 128 << 20);
    let table = env.yard(&alice, &["nodes"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(text.contains("4/4") && text.contains("0 GPUs") && text.contains(GPU), "{text}");
    assert!(!text.contains("alice-running") && !text.contains("bob-0"), "no job is named: {text}");

    // The same on the dashboard's queue page.
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &alice).await;
    let (status, html) = web.get("/queue").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("alice-waits") && !html.contains("bob-1"), "{html}");
    assert!(html.contains("And 1 waiting jobs of other tenants") && html.contains("4 of 4"), "{html}");
    assert!(html.contains("<td>128 MiB of "), "memory in human units: {html}");
}

/// Two tenants of a cohort each run two jobs that take their whole grace period to stop, and
/// each then asks for a job that only room taken from its own lower-priority jobs can make.
/// The room the first one's preemption frees is its own: the second preempts for itself at
/// once, instead of counting on that room, waiting out a whole stop and racing for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_preemptor_does_not_wait_on_the_room_promised_to_the_first() {
    let env = TestEnv::start_with(&["--simulate-gpus", "8", "--simulate-gpu-type", GPU, "--grace-seconds", "30"]).await;
    let admin = env.admin_token.clone();
    let mut tokens = Vec::new();
    for team in ["team-a", "team-b"] {
        assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": team})).await.0, StatusCode::CREATED);
        let policy = json!({"cohort": "lab", "preempt_lower_priority": true});
        let path = format!("/api/v1/admin/tenants/{team}");
        assert_eq!(env.call(Method::PATCH, &path, Some(&admin), Some(&policy)).await.0, StatusCode::NO_CONTENT);
        let path = format!("/api/v1/admin/tenants/{team}/quotas/{GPU}");
        let quota = json!({"nominal": 4, "borrowing_limit": 4});
        assert_eq!(env.call(Method::PUT, &path, Some(&admin), Some(&quota)).await.0, StatusCode::OK);
        tokens.push(env.member(team, &format!("{team}-user"), "member").await);
    }
    // Jobs that ignore SIGTERM (`sleep` inherits the ignored signal): a stop takes the grace
    // period (30 s) before SIGKILL. A minute at most, so none outlives the test for long.
    let stubborn = |name: &str, priority: i32, gpus: u32| {
        json!({"name": name, "command": ["sh", "-c", "trap '' TERM; sleep 60"],
               "priority": priority, "resources": {"gpus": gpus, "cpu": 0.1, "memory": "64Mi"}})
    };
    let submit = |token: String, body: Value| {
        let env = &env;
        async move {
            let (status, job) = env.post("/api/v1/jobs", &token, &body).await;
            assert_eq!(status, StatusCode::CREATED, "{job}");
            job["id"].as_str().unwrap().to_string()
        }
    };
    let mut small = Vec::new();
    for (team, token) in tokens.iter().enumerate() {
        for i in 0..2 {
            let id = submit(token.clone(), stubborn(&format!("small-{i}"), 0, 2)).await;
            wait_running(&env, token, &id).await;
            small.push((team, id));
        }
    }
    // Team a's large job preempts a's small ones, which take 30 s to stop.
    let a_large = submit(tokens[0].clone(), stubborn("large", 10, 4)).await;
    let preempted_for = |job: Value, preemptor: &str| {
        job["reason"].as_str().is_some_and(|r| r.starts_with("preempted") && r.contains(preemptor))
    };
    for (_, id) in small.iter().filter(|(team, _)| *team == 0) {
        env.wait_job_as(&tokens[0], id, Duration::from_secs(15), |j| preempted_for(j.clone(), &a_large)).await;
    }
    // Team b's large job, while a's victims are still stopping: it preempts b's own at once.
    let asked = std::time::Instant::now();
    let b_large = submit(tokens[1].clone(), stubborn("large", 10, 4)).await;
    for (_, id) in small.iter().filter(|(team, _)| *team == 1) {
        env.wait_job_as(&tokens[1], id, Duration::from_secs(15), |j| preempted_for(j.clone(), &b_large)).await;
    }
    assert!(asked.elapsed() < Duration::from_secs(15), "b's preemption waited {:?}", asked.elapsed());
    for (_, id) in small.iter().filter(|(team, _)| *team == 0) {
        let job = state(&env, &tokens[0], id).await;
        assert_eq!(job["state"], "running", "a's victims are still stopping: {job}");
    }
}

/// Start estimates say what they assume (issue #43): with no history, a running job's end is
/// guessed from the platform's default and the waiting job's schedule says so, naming the job it
/// waits for; after three runs of the same kind, the median of those runs, and the estimate
/// moves from an hour away to now. A what-if that would preempt says so and expects to start
/// within the grace period, not when the victim would have ended.
#[tokio::test(flavor = "multi_thread")]
async fn estimates_say_what_they_assume_and_name_the_job_they_wait_for() {
    let env = TestEnv::start_with(&["--simulate-gpus", "1", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-a"})).await.0, StatusCode::CREATED);
    let quota = env.yard(&admin, &["admin", "quota", "set", "team-a", GPU, "--nominal", "1"]);
    assert!(quota.status.success(), "{}", stderr(&quota));
    let alice = env.member("team-a", "alice", "member").await;
    let submit = |name: &'static str, seconds: u32| {
        json!({"name": name, "command": ["sleep", seconds.to_string()],
               "resources": {"gpus": 1, "cpu": 0.1, "memory": "64Mi"}})
    };
    let schedule_of = |id: String| {
        let env = &env;
        let alice = alice.clone();
        async move {
            let (status, schedule) = env.get(&format!("/api/v1/jobs/{id}/schedule"), &alice).await;
            assert_eq!(status, StatusCode::OK, "{schedule}");
            schedule
        }
    };

    // No history: the running job is assumed to take the platform's default hour.
    let (_, first) = env.post("/api/v1/jobs", &alice, &submit("long-run", 600)).await;
    let first = first["id"].as_str().unwrap().to_string();
    wait_running(&env, &alice, &first).await;
    let (_, waiting) = env.post("/api/v1/jobs", &alice, &submit("waiter", 1)).await;
    let waiting = waiting["id"].as_str().unwrap().to_string();
    let schedule = schedule_of(waiting.clone()).await;
    let blocker = &schedule["waits_for"][0];
    assert_eq!(blocker["job"], first.as_str(), "the waiting job names the job it waits for: {schedule:#}");
    assert_eq!(blocker["name"], "long-run");
    assert_eq!(blocker["state"], "running");
    assert_eq!(
        blocker["assuming"], "assuming 1h, the platform's default (no history, no declared run time)",
        "{schedule:#}"
    );
    let start: chrono::DateTime<chrono::Utc> = schedule["estimated_start"].as_str().unwrap().parse().unwrap();
    let ahead = start - chrono::Utc::now();
    assert!(ahead > chrono::Duration::minutes(55), "about an hour away: {schedule:#}");
    // The CLI says it too, with the short id the CLI prints everywhere.
    let shown = stdout(&env.yard(&alice, &["jobs", "show", &waiting]));
    assert!(
        shown.contains(&format!(
            "after:    job {} long-run (running; assuming 1h, the platform's default",
            &first[..13]
        )),
        "{shown}"
    );

    // Three short runs of the same kind by the same user make a history.
    let (status, _) = env.post(&format!("/api/v1/jobs/{first}/cancel"), &alice, &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    env.wait_job_as(&alice, &waiting, Duration::from_secs(60), |j| j["state"] == "succeeded").await;
    for _ in 0..3 {
        let (_, run) = env.post("/api/v1/jobs", &alice, &submit("quick", 2)).await;
        let run = run["id"].as_str().unwrap().to_string();
        env.wait_job_as(&alice, &run, Duration::from_secs(60), |j| j["state"] == "succeeded").await;
    }
    let (_, fourth) = env.post("/api/v1/jobs", &alice, &submit("quick", 600)).await;
    let fourth = fourth["id"].as_str().unwrap().to_string();
    wait_running(&env, &alice, &fourth).await;
    let (_, next) = env.post("/api/v1/jobs", &alice, &submit("after-quick", 1)).await;
    let next = next["id"].as_str().unwrap().to_string();
    let schedule = schedule_of(next.clone()).await;
    let assuming = schedule["waits_for"][0]["assuming"].as_str().unwrap_or_default().to_string();
    assert!(
        assuming.contains("the median of the last 3 runs of jobs named quick on 1 x 1 GPU by the same user"),
        "{schedule:#}"
    );
    assert_eq!(schedule["waits_for"][0]["job"], fourth.as_str());
    let start: chrono::DateTime<chrono::Utc> = schedule["estimated_start"].as_str().unwrap().parse().unwrap();
    assert!(start - chrono::Utc::now() < chrono::Duration::minutes(1), "the history says a few seconds: {schedule:#}");
    // The waiting job's own guess: nothing known of "after-quick".
    assert_eq!(schedule["runtime_assumed"], "assuming 1h, the platform's default (no history, no declared run time)");

    // A job on spare room of a tenant without quota holds the GPU once team-a's jobs are gone;
    // team-a's what-if would preempt it and start within the grace period.
    for id in [&fourth, &next] {
        env.post(&format!("/api/v1/jobs/{id}/cancel"), &alice, &json!({})).await;
    }
    let spare = json!({"name": "spare", "command": ["sleep", "600"], "spare": true,
                       "resources": {"gpus": 1, "cpu": 0.1, "memory": "64Mi"}});
    let (status, spare) = env.post("/api/v1/jobs", &admin, &spare).await;
    assert_eq!(status, StatusCode::CREATED, "{spare}");
    env.wait_job_as(&admin, spare["id"].as_str().unwrap(), Duration::from_secs(60), |j| j["state"] == "running").await;
    let (status, what_if) = env.post("/api/v1/jobs/what-if", &alice, &submit("preemptor", 60)).await;
    assert_eq!(status, StatusCode::OK, "{what_if}");
    assert_eq!(what_if["would_preempt"], 1, "{what_if:#}");
    let start: chrono::DateTime<chrono::Utc> = what_if["estimated_start"].as_str().unwrap().parse().unwrap();
    assert!(start - chrono::Utc::now() <= chrono::Duration::seconds(12), "within the grace period: {what_if:#}");
    let said = env
        .yard(&alice, &["submit", "--what-if", "--gpus", "1", "--cpu", "0.1", "--memory", "64Mi", "--", "sleep", "60"]);
    assert!(stdout(&said).contains("once the job it preempts has stopped"), "{}{}", stdout(&said), stderr(&said));
}
