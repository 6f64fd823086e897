package lambdaenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// The fleet's control database follows a rotation of its secret as the function's own pool
// does (TestPoolReReadsTheSecretAfterAFailedConnectionAttempt): the registry read after the
// first failed connection attempt re-reads the secret and lists the tenants again.
func TestTheFleetRegistryReReadsItsSecretAfterARotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.URL(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	require.NoError(t, fleet.CreateRegistryTable(ctx, admin))
	require.NoError(t, fleet.AddTenant(ctx, admin, fleet.Tenant{Name: "acme", DatabaseURL: dbURL}))
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	oldRole, newRole := "sluice_ctl_old_"+suffix, "sluice_ctl_new_"+suffix
	for _, r := range []string{oldRole, newRole} {
		_, err := admin.Exec(ctx, "CREATE ROLE "+r+" LOGIN")
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "GRANT SELECT ON "+fleet.RegistryTable+" TO "+r)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = admin.Exec(context.WithoutCancel(ctx), "REVOKE ALL ON "+fleet.RegistryTable+" FROM "+r)
			_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP ROLE IF EXISTS "+r)
		})
	}
	secret := &rotatingSecret{stages: map[string]string{"AWSCURRENT": secretJSON(t, dbURL, oldRole)}}
	getenv := env(map[string]string{FleetRegistrySecretARN: "arn:control", DatabaseSSLMode: "disable", DatabaseSecretRefresh: "0s"})
	reg, closeReg, err := FleetRegistry(ctx, getenv, secret)
	require.NoError(t, err)
	defer closeReg()
	names := func() ([]string, error) {
		ts, err := reg.Tenants(ctx)
		var out []string
		for _, tn := range ts {
			out = append(out, tn.Name)
		}
		return out, err
	}
	got, err := names()
	require.NoError(t, err)
	require.Equal(t, []string{"acme"}, got)

	// The rotation: the old role may no longer log in, the secret holds the new one; the
	// control pool's connection ends (idle timeout, failover).
	_, err = admin.Exec(ctx, "ALTER ROLE "+oldRole+" NOLOGIN")
	require.NoError(t, err)
	secret.set("AWSCURRENT", secretJSON(t, dbURL, newRole))
	reg.(fleet.Registries)[1].(fleet.Table).DB.(interface{ Reset() }).Reset()

	_, err = names()
	require.Error(t, err, "the cached credentials no longer work")
	got, err = names()
	require.NoError(t, err, "the next read re-read the secret")
	require.Equal(t, []string{"acme"}, got)
}
