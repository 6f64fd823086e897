package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
)

func context(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

// maxConnections is the new database's, or the imported one's: then it reaches
// ExistingDatabase, where the connection budget and the database alarms read it.
func TestMaxConnectionsReachesTheImportedDatabase(t *testing.T) {
	noEnv := context(nil)
	p, err := stackProps(context(map[string]string{"maxConnections": "400"}), noEnv)
	require.NoError(t, err)
	require.Equal(t, 400, p.MaxConnections)
	require.Nil(t, p.Database)

	p, err = stackProps(context(map[string]string{
		"maxConnections": "400", "databaseSecretArn": "arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf",
		"databaseInstanceId": "orders-db", "databasePort": "5433",
	}), noEnv)
	require.NoError(t, err)
	require.NotNil(t, p.Database)
	require.Equal(t, 400, p.Database.MaxConnections)
	require.Equal(t, "orders-db", p.Database.InstanceIdentifier)
	require.Equal(t, 5433, p.Database.Port)
	require.Zero(t, p.MaxConnections, "the stack's own database is not created")
}

func TestStackPropsFromContext(t *testing.T) {
	p, err := stackProps(context(map[string]string{
		"redriveRoleArns": "arn:aws:iam::111111111111:role/ops, arn:aws:iam::111111111111:role/oncall", "outboxRetention": "720h",
		"inboxRetention": "1000h", "natGateways": "1", "alarmDestination": "none",
		"destination": "msk", "mskClusterArn": "arn:aws:kafka:eu-west-1:111111111111:cluster/c/u", "mskSecurityGroupId": "sg-1", "mskTopic": "orders",
		"consumerCommitMode": "async", "relayIdleStop": "10s",
	}), context(map[string]string{"CDK_DEFAULT_ACCOUNT": "111111111111", "CDK_DEFAULT_REGION": "eu-west-1"}))
	require.NoError(t, err)
	require.Equal(t, infra.DestinationMSK, p.Destination)
	require.Equal(t, "arn:aws:kafka:eu-west-1:111111111111:cluster/c/u", p.MskClusterArn)
	require.Equal(t, "sg-1", p.MskSecurityGroupID)
	require.Equal(t, "orders", p.MskTopic)
	require.Equal(t, []string{"arn:aws:iam::111111111111:role/ops", "arn:aws:iam::111111111111:role/oncall"}, p.Redrivers)
	require.Equal(t, 720*time.Hour, p.OutboxRetention)
	require.Equal(t, 1000*time.Hour, p.InboxRetention)
	require.Equal(t, 1, p.NatGateways)
	require.True(t, p.NoAlarmDestination)
	require.Equal(t, "eu-west-1", *p.Env.Region)
	require.Nil(t, p.ClaimCheck, "no claim check unless asked")
	require.Nil(t, p.InstanceType)
	require.Zero(t, p.ConsumerMaxConcurrency)
	require.Equal(t, infra.CommitAsync, p.ConsumerCommitMode)
	require.Equal(t, 10*time.Second, p.Relay.IdleStop, "the relay's idle mode")

	// The cost table's 1,000 events/s column (docs/deploy.md), as deployed.
	p, err = stackProps(context(map[string]string{"alarmDestination": "none", "instanceType": "db.m7g.large", "maxConnections": "900",
		"maxAllocatedStorage": "1500", "consumerMaxConcurrency": "20"}), context(nil))
	require.NoError(t, err)
	require.Equal(t, "m7g.large", *p.InstanceType.ToString())
	require.Equal(t, 900, p.MaxConnections)
	require.Equal(t, 1500, p.MaxAllocatedStorageGB)
	require.Equal(t, 20, p.ConsumerMaxConcurrency)
	p, err = stackProps(context(map[string]string{"alarmDestination": "none", "claimCheck": "true", "claimCheckMaxPayload": "8388608"}), context(nil))
	require.NoError(t, err)
	require.Equal(t, 8<<20, p.ClaimCheck.MaxPayloadBytes)

	_, err = stackProps(context(map[string]string{"maxConnections": "many", "inboxRetention": "30 days", "fifo": "yes please",
		"databaseInstanceId": "orders-db"}), context(nil))
	for _, want := range []string{"context maxConnections", "context inboxRetention", "context fifo", "databaseInstanceId names an imported database"} {
		require.ErrorContains(t, err, want)
	}
}

// -c fleet=N and -c fleetShards=S reach the stack's Fleet and FleetShards.
func TestFleetContext(t *testing.T) {
	p, err := stackProps(context(map[string]string{"alarmDestination": "none", "fleet": "3", "fleetShards": "2"}), context(nil))
	require.NoError(t, err)
	require.Equal(t, 3, p.Fleet)
	require.Equal(t, 2, p.FleetShards)
	_, err = stackProps(context(map[string]string{"fleet": "three"}), context(nil))
	require.ErrorContains(t, err, "context fleet")
}
