-- pgbench script: the statement a submit runs (same columns, same triggers), straight into
-- Postgres: the ceiling for the API's submit rate on the same machine. A space follows every
-- JSON colon because pgbench reads ":name" as a variable.
INSERT INTO jobs (id, tenant_id, name, spec, priority, max_restarts, last_actor, request_hash, created_by)
SELECT gen_random_uuid(), t.id, 'python',
       '{"command": ["python", "train.py", "--lr", "3e-4"], "args": [], "env": {}, "resources": {"cpu": 4.0, "memory": "16Gi", "gpus": 64, "gpu_type": null}, "replicas": 2}',
       0, 0, 'user: admin', '\x00', u.id
FROM tenants t, users u;
