-- The key that signs download links now lives in a file only the server reads
-- (`--signing-key-file`), not in the database: whoever can read a dump or a replica of the
-- database must not be able to sign a link to any tenant's artefacts. Links signed with the old
-- key (they lived a day at most) stop working.
DROP TABLE server_secrets;
