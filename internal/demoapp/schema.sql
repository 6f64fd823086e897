-- The demo domain: an orders service (producer side) and a ledger consumer (consumer side).
-- Not part of sluice's own schema (migrations/): applied by the demo, the e2e tests and the
-- ledger consumer (examples/ledger) at cold start. Idempotent.

-- Producer: the orders service's table. Each order and its OrderCreated event commit together.
CREATE TABLE IF NOT EXISTS demo_orders (
    order_id     text PRIMARY KEY,
    customer     text NOT NULL,
    seq          int NOT NULL,       -- per-customer sequence number: FIFO order is checked on it
    amount_cents bigint NOT NULL,
    currency     text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Consumer: reference data the ledger validates against. An order in an unknown currency is a
-- poison message until an operator adds the currency.
CREATE TABLE IF NOT EXISTS demo_currencies (code text PRIMARY KEY);
INSERT INTO demo_currencies (code) VALUES ('EUR'), ('USD'), ('GBP') ON CONFLICT DO NOTHING;

-- Consumer: one ledger entry per applied OrderCreated. message_id is deliberately NOT unique,
-- so that a message applied twice would show up as two rows; the inbox is what prevents it.
CREATE TABLE IF NOT EXISTS demo_ledger (
    entry_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- apply order
    message_id   text NOT NULL,
    order_id     text NOT NULL,
    customer     text NOT NULL,
    seq          int NOT NULL,
    amount_cents bigint NOT NULL,
    currency     text NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS demo_ledger_message_id ON demo_ledger (message_id);

-- Consumer: a per-customer projection updated in the same transaction.
CREATE TABLE IF NOT EXISTS demo_customer_balance (
    customer    text PRIMARY KEY,
    orders      int NOT NULL,
    total_cents bigint NOT NULL,
    last_seq    int NOT NULL,
    updated_at  timestamptz NOT NULL
);
