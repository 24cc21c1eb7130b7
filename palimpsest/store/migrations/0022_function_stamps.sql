-- The digest of the functions file (functions.sql) last applied to this database: the migration
-- runner applies the file again only when its text differs, so a start with nothing changed leaves
-- the functions (and the plans every connection cached for them) alone, and a role that does not
-- own them may still start a store. One row at most.
CREATE TABLE schema_functions (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    digest     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
