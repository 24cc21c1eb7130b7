-- A calibrated observation's characters by class (whitespace, digits, Latin, CJK, other letters,
-- symbols): a model without a usable vocabulary is priced per class, which follows a change of
-- content (prose to logs to CJK) that one chars-per-token rate cannot.
ALTER TABLE calibration_observations
    ADD COLUMN chars_space        bigint NOT NULL DEFAULT 0,
    ADD COLUMN chars_digit        bigint NOT NULL DEFAULT 0,
    ADD COLUMN chars_latin        bigint NOT NULL DEFAULT 0,
    ADD COLUMN chars_cjk          bigint NOT NULL DEFAULT 0,
    ADD COLUMN chars_other_letter bigint NOT NULL DEFAULT 0,
    ADD COLUMN chars_symbol       bigint NOT NULL DEFAULT 0;
