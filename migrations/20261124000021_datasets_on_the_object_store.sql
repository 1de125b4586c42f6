-- Datasets pushed to Trainyard's object store (`yard datasets push`, issue 23): a registered
-- version may keep its files in the tenant's part of the store, content-addressed by the
-- manifest's content hash. `store_prefix` is that key prefix; NULL for a dataset kept elsewhere
-- (a folder on shared storage, as before). The constraint pins it under the row's own tenant, so
-- that no row can point one tenant's jobs at another tenant's files, whatever the code does.
-- A version stays immutable (the trigger `datasets_immutable` refuses every UPDATE).
ALTER TABLE datasets ADD COLUMN store_prefix text
    CONSTRAINT datasets_store_prefix_in_tenant
        CHECK (store_prefix ~ ('^tenants/' || tenant_id::text || '/datasets/content/[0-9a-f]{64}$'));
