package lambdaenv_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// The fleet's settings are read from the environment, each bad one named by its variable.
func TestFleetConfigReadsBurstPipelines(t *testing.T) {
	t.Parallel()
	env := map[string]string{lambdaenv.FleetTenants: `[{"name":"acme","databaseUrl":"postgres://u@db.internal/acme"}]`}
	getenv := func(k string) string { return env[k] }

	cfg, closeRegistry, err := lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.NoError(t, err)
	closeRegistry()
	require.Zero(t, cfg.BurstPipelines, "unset: the fleet's default")

	env[lambdaenv.FleetBurstPipelines] = "3"
	cfg, closeRegistry, err = lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.NoError(t, err)
	closeRegistry()
	require.Equal(t, 3, cfg.BurstPipelines)

	env[lambdaenv.FleetBurstPipelines] = "0"
	_, _, err = lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.ErrorContains(t, err, lambdaenv.FleetBurstPipelines)

	delete(env, lambdaenv.FleetBurstPipelines)
	env[lambdaenv.FleetIAMServers] = `db1`
	_, _, err = lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.ErrorContains(t, err, lambdaenv.FleetIAMServers, "a bad IAM server list stops the cold start")
	env[lambdaenv.FleetIAMServers] = `["db1"]`
	_, closeRegistry, err = lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.NoError(t, err)
	closeRegistry()
}

// With a control database, the fleet records its tenants' turns there (Config.TurnState);
// with a static list alone it records nothing.
func TestFleetConfigRecordsTurnsInTheControlDatabase(t *testing.T) {
	t.Parallel()
	env := map[string]string{lambdaenv.FleetTenants: `[{"name":"acme","databaseUrl":"postgres://u@db.internal/acme"}]`}
	getenv := func(k string) string { return env[k] }
	cfg, closeRegistry, err := lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.NoError(t, err)
	closeRegistry()
	require.Nil(t, cfg.TurnState, "no control database")

	env[lambdaenv.FleetRegistryURL] = "postgres://u@control.internal/fleet"
	cfg, closeRegistry, err = lambdaenv.FleetConfig(context.Background(), getenv, nil)
	require.NoError(t, err)
	defer closeRegistry()
	require.NotNil(t, cfg.TurnState, "the control database records the turns")
}
