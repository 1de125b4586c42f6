-- Removing a tenant (issue #18). A platform admin asks for it: from then on the tenant takes in
-- nothing new (the triggers below refuse new members, tokens, quotas, jobs, templates, datasets
-- and volumes, whatever path tries), its tokens are revoked and its unfinished jobs cancelled.
-- When the last of them has ended the reconciler removes what the executor holds for it (the
-- Kubernetes namespace, the local volumes) and sets removed_at. The row stays: jobs, the usage
-- ledger and the audit log name it, and its name is not given to another tenant.
ALTER TABLE tenants
    ADD COLUMN removal_requested_at timestamptz,
    ADD COLUMN removed_at timestamptz,
    ADD CONSTRAINT tenants_removed_after_request CHECK (removed_at IS NULL OR removal_requested_at IS NOT NULL);

-- The reconciler's question every pass: which tenants are being removed? Usually none.
CREATE INDEX tenants_being_removed ON tenants (id) WHERE removal_requested_at IS NOT NULL AND removed_at IS NULL;

CREATE FUNCTION tenant_takes_nothing_new() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    name text;
BEGIN
    SELECT t.name INTO name FROM tenants t WHERE t.id = NEW.tenant_id AND t.removal_requested_at IS NOT NULL;
    IF FOUND THEN
        RAISE EXCEPTION 'tenant % is being removed; it takes nothing new', name USING ERRCODE = 'TYR01';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER memberships_not_in_removed_tenant BEFORE INSERT OR UPDATE ON memberships
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER api_tokens_not_in_removed_tenant BEFORE INSERT ON api_tokens
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER quotas_not_in_removed_tenant BEFORE INSERT OR UPDATE ON quotas
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER jobs_not_in_removed_tenant BEFORE INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER templates_not_in_removed_tenant BEFORE INSERT ON templates
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER datasets_not_in_removed_tenant BEFORE INSERT ON datasets
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER volumes_not_in_removed_tenant BEFORE INSERT ON volumes
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
