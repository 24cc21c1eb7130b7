-- Exact observations: the prompt's shape by the model's own tokenizer, from which the chat
-- template's cost per message, tool and image is fitted (chars is 0 for them).
ALTER TABLE calibration_observations
    ADD COLUMN content_tokens     bigint  NOT NULL DEFAULT 0,
    ADD COLUMN messages           integer NOT NULL DEFAULT 0,
    ADD COLUMN tool_results       integer NOT NULL DEFAULT 0,
    ADD COLUMN tool_calls         integer NOT NULL DEFAULT 0,
    ADD COLUMN tools              integer NOT NULL DEFAULT 0,
    ADD COLUMN image_prior_tokens bigint  NOT NULL DEFAULT 0,
    ADD COLUMN images             integer NOT NULL DEFAULT 0;

-- The newest of each kind is read on every size check; one kind must never be found by scanning
-- past thousands of rows of the other.
CREATE INDEX calibration_observations_exact ON calibration_observations (model, id DESC) WHERE content_tokens > 0;
CREATE INDEX calibration_observations_chars ON calibration_observations (model, id DESC) WHERE content_tokens = 0;
