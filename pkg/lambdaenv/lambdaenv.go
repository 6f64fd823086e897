// Package lambdaenv is the environment contract between the CDK constructs and the Lambdas:
// the variable names (both sides import these constants, so they cannot drift apart) and the
// one reader of each setting (RelayConfig, ConsumerConfig, OpenPool), used by sluice's own
// functions, the CLI and a team's consumer copied from lambdas/consumer. The relay's tunable
// numbers and their variables are declared in outbox.RelaySettings and read by RelaySettings.
package lambdaenv

const (
	// DatabaseURL is a PostgreSQL URL; used locally and in tests. Takes precedence over DatabaseSecretARN.
	DatabaseURL = "DATABASE_URL"
	// DatabaseSecretARN names a Secrets Manager secret in the RDS JSON shape
	// ({"host","port","username","password","dbname"}), read once per cold start.
	DatabaseSecretARN = "DATABASE_SECRET_ARN"
	// DatabaseSSLMode is the sslmode used with DatabaseSecretARN. Defaults to DefaultSSLMode
	// ("verify-full"): the server certificate must chain to DatabaseSSLRootCert and name the host.
	DatabaseSSLMode = "DATABASE_SSLMODE"
	// TopicARNs is a JSON object mapping logical topic names (outbox_event.topic) to
	// destinations: SNS topic, EventBridge bus or Kinesis stream ARNs, or Kafka topics as
	// kafka://TOPIC (outbox.ParseDestination).
	TopicARNs = "SLUICE_TOPIC_ARNS"
	// DefaultTopicARN receives rows whose topic is not in TopicARNs. Optional; without it such rows are quarantined.
	DefaultTopicARN = "SLUICE_DEFAULT_TOPIC_ARN"
	// ConsumerName is the inbox consumer name (the first half of the inbox key).
	ConsumerName = "SLUICE_CONSUMER_NAME"
	// ConsumerCommitMode is "per-record" (default) or "batched".
	ConsumerCommitMode = "SLUICE_CONSUMER_COMMIT_MODE"
	// LogLevel is the functions' slog level: debug, info (default), warn or error. At debug the
	// relay logs each round's claim, publish and record times.
	LogLevel = "SLUICE_LOG_LEVEL"
	// DatabaseMaxConns caps the pgx pool per Lambda instance. Defaults to 4.
	DatabaseMaxConns = "DATABASE_MAX_CONNS"
	// DatabaseSSLRootCert is the PEM file of certificate authorities that sign the database's
	// server certificate (the RDS CA bundle, which also holds the roots of RDS Proxy's
	// certificates), used with DatabaseSecretARN; "system" uses the operating system's trust
	// store. Defaults to none: the system's trust store, which lacks the RDS CAs.
	DatabaseSSLRootCert = "DATABASE_SSLROOTCERT"
	// DatabaseHost replaces the secret's host (and DatabasePort its port), e.g. with an RDS Proxy
	// endpoint. Defaults to the secret's.
	DatabaseHost = "DATABASE_HOST"
	// DatabasePort replaces the secret's port. Defaults to the secret's.
	DatabasePort = "DATABASE_PORT"
	// DatabaseQueryExecMode is pgx's default query execution mode: cache_statement (the default:
	// named prepared statements, cached per connection), cache_describe, describe_exec, exec or
	// simple_protocol. Behind RDS Proxy use exec or simple_protocol: named prepared statements
	// pin each client connection to one database connection.
	DatabaseQueryExecMode = "DATABASE_QUERY_EXEC_MODE"
	// DatabaseSecretRefresh is the shortest time between two re-reads of DatabaseSecretARN after
	// a connection attempt failed (Go duration). Defaults to 5s.
	DatabaseSecretRefresh = "DATABASE_SECRET_REFRESH"
	// OutboxRetention is the retention of a partitioned outbox_event (Go duration, e.g. 720h):
	// maintenance drops the partitions whose rows were all published longer ago
	// (partition.Maintain). Read by the migrate Lambda's scheduled maintenance, and by a
	// relay Lambda, which maintains partitions only when this or OutboxPartitionInterval is set
	// (it needs the owner's privileges). Defaults to unset: nothing is dropped (partitions are
	// still created ahead). A plain outbox_event is never changed. See Partitions.
	OutboxRetention = "SLUICE_OUTBOX_RETENTION"
	// OutboxPartitionInterval is how long a new partition of a partitioned outbox_event should
	// take to fill at the observed rate (Go duration). Defaults to
	// partition.DefaultInterval (24h).
	OutboxPartitionInterval = "SLUICE_OUTBOX_PARTITION_INTERVAL"
)
