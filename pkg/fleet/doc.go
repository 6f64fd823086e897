// Package fleet runs one relay deployment for a fleet of tenant databases: a database (or a
// schema's database) per tenant, or shards, many of them on one PostgreSQL server.
//
// A [Registry] says which tenant databases exist ([Static] from the stack's settings, [Table]
// from a control table, so a tenant is added without a deploy); a [Fleet] reads it every
// RegistryRefresh and runs an [outbox.Relay] for each tenant that has work, on a pool opened
// for that turn. A tenant that published keeps its connections parked for IdleClose, booked in
// its server's budget, so that its next turn needs no new session; the budget asks parked
// connections back (the longest parked first) when another tenant needs them, and a tenant
// that has published nothing for IdleClose closes them: an idle tenant holds no connection.
//
// The guarantees, and the one place each is enforced:
//   - Per-key order and every isolation guarantee hold per tenant exactly as for one database:
//     each tenant's rows are claimed and published by an ordinary outbox.Relay on that tenant's
//     own database (fleet.go, tenant.turn); the fleet adds no state the relay's correctness reads.
//   - The connections of a fleet never exceed a server's budget: every pool is sized before it
//     is opened and its connections are taken from that server's budget first, and stay booked
//     there while parked until the tenant has closed them (budget.go).
//   - Fairness: the budget is granted first come, first served; a tenant holds at most
//     Weight × Pipelines connections while another tenant of its server waits (it grows to
//     Weight × BurstPipelines only on free connections nobody waits for, and gives the extra
//     ones back as soon as one does: budget.grow, budget.shrink); and once another tenant has
//     waited a Turn while the tenants past their Weight × Turn hold more than BusyShare of the
//     budget, the one of them that began first gives its connections back (budget.go,
//     budget.giveWay; fleet.go, tenant.turn).
//   - Liveness: every registered tenant is looked at directly at least every SweepInterval;
//     the server-wide activity poll (pg_stat_database and pg_stat_activity, one query per
//     server per DetectInterval, and between polls a commit-log lookup for each write
//     transaction the last poll saw in flight: writes.go) only brings a tenant's turn sooner,
//     it never decides that one is not due.
//   - A failing tenant (unreachable, wrong password, broken schema) costs only its own turns:
//     its error is recorded in its [TenantStatus] and it is retried with a backoff.
//
// Every message a fleet publishes carries its tenant's name in the header
// [outbox.TenantHeader], so consumers can apply it in the tenant's own database.
package fleet
