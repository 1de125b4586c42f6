//! The peer of `tests/bench/kube_launch.sh`: the same four applies per launch as the executor
//! (the Job, then its Service, ConfigMap and Secret together, owned by it), sent by a minimal
//! client with N launches in flight and one reused connection pool: the ceiling any control plane
//! could reach against this API server on this machine. The objects are copies of a Job Trainyard
//! made (read as the admin), applied as Trainyard's service account, then deleted.
//!
//! Usage: launch_peer ADMIN_KUBECONFIG EXECUTOR_KUBECONFIG LAUNCHES IN_FLIGHT

use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

async fn client(path: &str) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("usable");
    trainyard_kube::client_for(config, &trainyard_kube::KubeConfig::new("peer", std::env::temp_dir()))
        .expect("a client")
}

/// An object as it would be applied: no server-set fields, a new name, owned by `owner`.
fn fresh<K: Resource + serde::Serialize + serde::de::DeserializeOwned>(
    object: &K,
    name: &str,
    owner: Option<(&str, &str)>,
) -> K {
    let mut value = serde_json::to_value(object).unwrap();
    let meta = value["metadata"].as_object_mut().unwrap();
    for key in ["uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "ownerReferences"] {
        meta.remove(key);
    }
    meta.insert("name".into(), json!(name));
    if let Some((owner, uid)) = owner {
        meta.insert(
            "ownerReferences".into(),
            json!([{ "apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": uid, "controller": true, "blockOwnerDeletion": true }]),
        );
    }
    value.as_object_mut().unwrap().remove("status");
    serde_json::from_value(value).unwrap()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, admin, executor, launches, in_flight] = args.as_slice() else {
        panic!("usage: launch_peer ADMIN_KUBECONFIG EXECUTOR_KUBECONFIG LAUNCHES IN_FLIGHT");
    };
    let (launches, in_flight): (usize, usize) = (launches.parse().unwrap(), in_flight.parse().unwrap());
    let (admin, executor) = (client(admin).await, client(executor).await);

    let made = Api::<Job>::all(admin.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=trainyard").limit(1))
        .await
        .unwrap();
    let template = made.items.into_iter().next().expect("a Job Trainyard made");
    let namespace = template.namespace().unwrap();
    let name = template.name_any();
    let service = Api::<Service>::namespaced(admin.clone(), &namespace).get(&name).await.unwrap();
    let config_map = Api::<ConfigMap>::namespaced(admin.clone(), &namespace).get(&name).await.unwrap();
    let mut job = template.clone();
    if let Some(spec) = job.spec.as_mut() {
        spec.selector = None;
        if let Some(labels) = spec.template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.retain(|k, _| !k.starts_with("batch.kubernetes.io/") && k != "controller-uid" && k != "job-name");
        }
    }
    // Headless, as Trainyard's (clusterIP "None"): no service IP is allocated.
    let secret: Secret =
        serde_json::from_value(json!({ "metadata": { "name": "x" }, "stringData": { "TRAINYARD_TOKEN": "tyj_peer" } }))
            .unwrap();

    let jobs: Api<Job> = Api::namespaced(executor.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(executor.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(executor.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(executor.clone(), &namespace);
    let params = PatchParams::apply("trainyard-peer").force();
    // Names of this run only: an earlier run's Jobs may still be going.
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let started = Instant::now();
    let failures = futures::stream::iter(0..launches)
        .map(|i| {
            let (job, service, config_map, secret) = (&job, &service, &config_map, &secret);
            let (jobs, services, config_maps, secrets, params) = (&jobs, &services, &config_maps, &secrets, &params);
            async move {
                let name = format!("peer-{run}-{i}");
                let mut object = fresh(job, &name, None);
                object.labels_mut().insert("trainyard.dev/job".into(), format!("00000000-0000-0000-0000-{i:012}"));
                let made = jobs.patch(&name, params, &Patch::Apply(&object)).await?;
                let uid = made.uid().unwrap_or_default();
                let owner = Some((name.as_str(), uid.as_str()));
                let service = Patch::Apply(fresh(service, &name, owner));
                let config_map = Patch::Apply(fresh(config_map, &name, owner));
                let secret = Patch::Apply(fresh(secret, &name, owner));
                let (a, b, c) = futures::join!(
                    services.patch(&name, params, &service),
                    config_maps.patch(&name, params, &config_map),
                    secrets.patch(&name, params, &secret),
                );
                a.and(b.map(|_| ())).and(c.map(|_| ())).map(|_| ())
            }
        })
        .buffer_unordered(in_flight.max(1))
        .filter(|r: &Result<(), kube::Error>| {
            if let Err(err) = r {
                eprintln!("a launch failed: {err}");
            }
            futures::future::ready(r.is_err())
        })
        .count()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({ "peer_in_flight": in_flight, "launches": launches, "failed": failures,
                "launches_per_s": (launches as f64 / seconds * 10.0).round() / 10.0, "requests": launches * 4 })
    );
    for i in 0..launches {
        let _ = jobs.delete(&format!("peer-{run}-{i}"), &DeleteParams::background()).await;
    }
}
