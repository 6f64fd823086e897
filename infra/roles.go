package infra

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
)

// Database role kinds (DatabaseRoleProps.Kind), as the migrate handler knows them.
const (
	// RoleRelay may read outbox_event and update its rows, and read outbox_control.
	RoleRelay = "relay"
	// RoleConsumer may read, insert, update and delete the inbox_event rows of its consumer name (row
	// level security), plus its Grants.
	RoleConsumer = "consumer"
)

// DatabaseGrant is a privilege a consumer's handlers need, e.g. on the tables they write.
type DatabaseGrant struct {
	// Table is a table name, optionally schema-qualified ("invoice", "billing.invoice"). The table
	// must exist when the migrations custom resource runs. Set Table or Schema.
	Table string
	// Schema is a schema name. Set Table or Schema.
	Schema string
	// Privileges are SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER (tables) or
	// USAGE, CREATE (schemas). Required.
	Privileges []string
}

var pgIdentifier = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

func (g DatabaseGrant) validate() error {
	allowed := []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"}
	switch {
	case (g.Table == "") == (g.Schema == ""):
		return errors.New("set exactly one of Table and Schema")
	case g.Schema != "":
		allowed = []string{"USAGE", "CREATE"}
		if !pgIdentifier.MatchString(g.Schema) {
			return fmt.Errorf("schema %q is not a lower-case PostgreSQL identifier", g.Schema)
		}
	default:
		parts := strings.Split(g.Table, ".")
		for _, part := range parts {
			if !pgIdentifier.MatchString(part) || len(parts) > 2 {
				return fmt.Errorf("table %q is not a lower-case, optionally schema-qualified PostgreSQL identifier", g.Table)
			}
		}
	}
	if len(g.Privileges) == 0 {
		return errors.New("no Privileges")
	}
	for _, p := range g.Privileges {
		if !slices.Contains(allowed, p) {
			return fmt.Errorf("privilege %q is not one of %s", p, strings.Join(allowed, ", "))
		}
	}
	return nil
}

// DatabaseRoleProps configure a DatabaseRole.
type DatabaseRoleProps struct {
	// Migrations is the migrations custom resource that creates the role. Required.
	Migrations Migrations
	// Name is the PostgreSQL role name (lower case, at most 63 bytes). Required.
	Name string
	// Kind is RoleRelay or RoleConsumer. Required.
	Kind string
	// Consumer is the inbox consumer name of a RoleConsumer role. Required for consumers.
	Consumer string
	// Grants are further privileges of a consumer role.
	Grants []DatabaseGrant
	// WALPublication, on a RoleRelay role, is the publication a relay that follows the WAL reads:
	// the migrations create it when missing and grant the role rds_replication.
	WALPublication string
	// Network places the secret's rotation function next to the database. Network.Vpc is required.
	Network Network
	// Database is the database the role is created in; its Connections admit the rotation
	// function. Database.Secret (the owner's) is not used by the role.
	Database Database
	// RotationDays is how often Secrets Manager rotates the role's password (single-user
	// rotation; warm functions re-read the secret when a connection fails). Defaults to 30;
	// -1 turns rotation off.
	RotationDays int
}

// DatabaseRole is one function's own PostgreSQL role: a secret (username = the role name, a
// generated password, completed with host, port and dbname by the migrations), rotated on a
// schedule, and the role itself, created by the migrations custom resource.
type DatabaseRole interface {
	constructs.IConstruct
	// Name is the role name.
	Name() string
	// Secret holds the role's credentials in the RDS JSON shape.
	Secret() awssecretsmanager.ISecret
}

type databaseRole struct {
	constructs.Construct
	name   string
	secret awssecretsmanager.Secret
}

func (r *databaseRole) Name() string                      { return r.name }
func (r *databaseRole) Secret() awssecretsmanager.ISecret { return r.secret }

func (p *DatabaseRoleProps) validate() error {
	var errs []error
	if p.Migrations == nil {
		errs = append(errs, errors.New("Migrations is required (it creates the role)"))
	}
	if !pgIdentifier.MatchString(p.Name) {
		errs = append(errs, fmt.Errorf("role name %q must be a lower-case PostgreSQL identifier of at most 63 bytes", p.Name))
	}
	switch p.Kind {
	case RoleRelay:
		if len(p.Grants) > 0 {
			errs = append(errs, errors.New("a relay role takes no Grants"))
		}
	case RoleConsumer:
		if p.Consumer == "" {
			errs = append(errs, errors.New("a consumer role needs its Consumer name"))
		}
	default:
		errs = append(errs, fmt.Errorf("Kind must be %q or %q, got %q", RoleRelay, RoleConsumer, p.Kind))
	}
	for i, g := range p.Grants {
		if err := g.validate(); err != nil {
			errs = append(errs, fmt.Errorf("Grants[%d]: %w", i, err))
		}
	}
	if p.RotationDays < -1 || p.RotationDays > 365 {
		errs = append(errs, fmt.Errorf("RotationDays must be 1..365, or -1 for no rotation, got %d", p.RotationDays))
	}
	return errors.Join(errs...)
}

// roleName turns a consumer name into a default role name: sluice_consumer_<name> in the
// characters a PostgreSQL identifier allows, at most 63 bytes.
func roleName(consumer string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(consumer) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	n := "sluice_consumer_" + b.String()
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// NewDatabaseRole creates a function's role secret and its rotation, and adds the role to the
// migrations custom resource. It panics on invalid props, naming every problem.
func NewDatabaseRole(scope constructs.Construct, id string, props *DatabaseRoleProps) DatabaseRole {
	p := *props
	p.RotationDays = orDefault(p.RotationDays, 30)
	invalid("DatabaseRole", id, p.validate(), p.Network.validate())
	mig := p.Migrations.(*migrations)

	r := &databaseRole{name: p.Name}
	constructs.NewConstruct_Override(r, scope, &id)
	this := r
	r.secret = awssecretsmanager.NewSecret(this, jsii.String("Secret"), &awssecretsmanager.SecretProps{
		Description: jsii.String("sluice database role " + p.Name + " (the migrations custom resource creates the role and adds host, port and dbname)"),
		GenerateSecretString: &awssecretsmanager.SecretStringGenerator{
			SecretStringTemplate: awscdk.Stack_Of(this).ToJsonString(map[string]any{"username": p.Name}, nil),
			GenerateStringKey:    jsii.String("password"),
			PasswordLength:       jsii.Number(40),
			ExcludePunctuation:   jsii.Bool(true),
		},
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	mig.addRole(p, r.secret)
	if p.RotationDays > 0 {
		rotateSecret(this, r.secret, p.Network, p.Database, p.RotationDays, mig.Resource())
	} else {
		suppress(r.secret, "AwsSolutions-SMG4", "Rotation of this role's secret is turned off in its DatabaseRoleProps (RotationDays -1).")
	}
	return r
}

// rotateSecret adds single-user hosted rotation to secret: a rotation function in the network
// that may reach the database and Secrets Manager. after is what must exist before the first
// rotation (the migrations that complete the secret); the schedule does not rotate on creation.
func rotateSecret(scope constructs.Construct, secret awssecretsmanager.ISecret, network Network, db Database, days int, after constructs.IConstruct) {
	sg := awsec2.NewSecurityGroup(scope, jsii.String("RotationSecurityGroup"), &awsec2.SecurityGroupProps{
		Vpc:              network.Vpc,
		Description:      jsii.String("sluice secret rotation: outbound to the database and Secrets Manager only"),
		AllowAllOutbound: jsii.Bool(false),
	})
	if db.Connections != nil {
		db.Connections.Connections().AllowDefaultPortFrom(sg, jsii.String("sluice secret rotation to PostgreSQL"))
	}
	https := awsec2.Port_Tcp(jsii.Number(443))
	if network.ApiEndpoints != nil {
		sg.Connections().AllowTo(network.ApiEndpoints, https, jsii.String("sluice secret rotation to Secrets Manager"))
	} else {
		sg.AddEgressRule(awsec2.Peer_AnyIpv4(), https, jsii.String("sluice secret rotation to Secrets Manager over HTTPS"), nil)
	}
	subnets := network.Subnets
	if subnets == nil {
		subnets = &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS}
	}
	schedule := secret.AddRotationSchedule(jsii.String("Rotation"), &awssecretsmanager.RotationScheduleOptions{
		HostedRotation: awssecretsmanager.HostedRotation_PostgreSqlSingleUser(&awssecretsmanager.SingleUserHostedRotationOptions{
			Vpc: network.Vpc, VpcSubnets: subnets, SecurityGroups: &[]awsec2.ISecurityGroup{sg},
		}),
		AutomaticallyAfter:        awscdk.Duration_Days(jsii.Number(float64(days))),
		RotateImmediatelyOnUpdate: jsii.Bool(false),
	})
	if after != nil {
		schedule.Node().AddDependency(after)
	}
}
