-- wrk script: submit a job that stays queued (more GPUs than any node has), so the benchmark
-- measures the API and Postgres, not process launches.
wrk.method = "POST"
wrk.body = '{"command":["python","train.py","--lr","3e-4"],"replicas":2,"resources":{"cpu":4,"memory":"16Gi","gpus":64}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TRAINYARD_TOKEN")
