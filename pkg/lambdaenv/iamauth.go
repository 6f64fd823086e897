package lambdaenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/fleet"
)

// FleetIAMServers is a JSON array of server names (fleet.Tenant.Server) whose tenant databases
// are logged in to with IAM database authentication: every new connection to a tenant of such
// a server gets a fresh token as its password, signed with the function's AWS credentials for
// the connection's host, port and user (the tenant's databaseUrl's, or its secret's) in the
// function's region; a password the URL or secret holds is not used. The server's tenants then
// need no password anywhere: a databaseUrl without one, or one secret per server naming the
// host and the user. The role must be allowed rds-db:connect for that user (the CDK's
// FleetServer.IAMAuth grants it) and the user must have the rds_iam role in the database.
// Defaults to none.
const FleetIAMServers = "SLUICE_FLEET_IAM_SERVERS"

// IAMTokenSigner returns an IAM database authentication token for user at endpoint (host:port).
type IAMTokenSigner func(ctx context.Context, endpoint, user string) (string, error)

// NewIAMTokenSigner returns the signer of awsCfg's region and credentials (auth.BuildAuthToken:
// a SigV4-presigned connect request for the rds-db service, valid 15 minutes, made without a
// call to AWS).
func NewIAMTokenSigner(awsCfg aws.Config) IAMTokenSigner {
	return func(ctx context.Context, endpoint, user string) (string, error) {
		return auth.BuildAuthToken(ctx, endpoint, awsCfg.Region, user, awsCfg.Credentials)
	}
}

// fleetIAMServers reads FleetIAMServers: the set of servers whose tenants log in with IAM.
func fleetIAMServers(getenv Getenv) (map[string]bool, error) {
	raw := getenv(FleetIAMServers)
	if raw == "" {
		return nil, nil
	}
	var names []string
	if err := json.Unmarshal([]byte(raw), &names); err != nil {
		return nil, fmt.Errorf("%s: want a JSON array of server names: %w", FleetIAMServers, err)
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set, nil
}

// lazySigner is the default AWS configuration's signer, loaded on the first token: a fleet
// without IAM servers never loads it.
func lazySigner() IAMTokenSigner {
	var (
		once   sync.Once
		signer IAMTokenSigner
		err    error
	)
	return func(ctx context.Context, endpoint, user string) (string, error) {
		once.Do(func() {
			var awsCfg aws.Config
			if awsCfg, err = config.LoadDefaultConfig(ctx); err == nil {
				signer = NewIAMTokenSigner(awsCfg)
			}
		})
		if err != nil {
			return "", fmt.Errorf("load AWS config for IAM database authentication: %w", err)
		}
		return signer(ctx, endpoint, user)
	}
}

// withIAMAuth makes cfg, the pool of tenant t, log each new connection in with a token from
// sign when t's server (its Server, else the pool's host:port) is in servers; other pools are
// returned unchanged. The token is made in BeforeConnect, after any BeforeConnect cfg already
// has (a secret's user), for the connection's host, port and user.
func withIAMAuth(cfg *pgxpool.Config, t fleet.Tenant, servers map[string]bool, sign IAMTokenSigner) *pgxpool.Config {
	server := t.Server
	if server == "" {
		server = net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	}
	if !servers[server] {
		return cfg
	}
	before := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if before != nil {
			if err := before(ctx, cc); err != nil {
				return err
			}
		}
		token, err := sign(ctx, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cc.User)
		if err != nil {
			return fmt.Errorf("tenant %s: IAM authentication token: %w", t.Name, err)
		}
		cc.Password = token
		return nil
	}
	return cfg
}
