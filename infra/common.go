package infra

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/sluicehq/sluice/internal/lambdaenv"
)

// Network places a Lambda in a VPC.
type Network struct {
	// Vpc is the VPC the Lambda runs in. Required.
	Vpc awsec2.IVpc
	// Subnets selects the Lambda's subnets. They need a route to SNS, Secrets Manager and
	// CloudFormation's response bucket (NAT or VPC endpoints). Defaults to the private subnets
	// with egress.
	Subnets *awsec2.SubnetSelection
	// SecurityGroups are the Lambda's security groups. Defaults to one new security group,
	// outbound allowed, no inbound.
	SecurityGroups []awsec2.ISecurityGroup
}

// Database says how a Lambda reaches PostgreSQL.
type Database struct {
	// Secret holds the credentials in the RDS JSON shape ({"host","port","username","password",
	// "dbname"}), such as the secret RDS generates. The Lambda gets read access to it. Required.
	Secret awssecretsmanager.ISecret
	// Connections, when set, gets an ingress rule on its default port from the Lambda's security
	// groups, e.g. an awsrds.DatabaseInstance or an imported one. Leave nil when you manage the
	// database's security group yourself.
	Connections awsec2.IConnectable
	// SSLMode is the libpq sslmode. Defaults to "require".
	SSLMode string
	// MaxConns caps the connection pool per Lambda instance; the database sees at most
	// MaxConns × concurrency connections per function. Defaults to the Lambda's default (4).
	MaxConns int
}

func (d Database) validate() error {
	var errs []error
	if d.Secret == nil {
		errs = append(errs, errors.New("Database.Secret is required"))
	}
	if d.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("Database.MaxConns must not be negative, got %d", d.MaxConns))
	}
	return errors.Join(errs...)
}

func (n Network) validate() error {
	if n.Vpc == nil {
		return errors.New("Network.Vpc is required")
	}
	return nil
}

// goFunctionProps are what newGoFunction needs.
type goFunctionProps struct {
	description         string
	codeDir             string
	timeout             time.Duration
	memoryMB            int
	reservedConcurrency int // 0: unreserved
	network             Network
	database            Database
	environment         map[string]*string
	logRetention        awslogs.RetentionDays
}

// newGoFunction creates a provided.al2023 arm64 Lambda from a directory holding `bootstrap`, in
// the VPC, with its own log group, read access to the database secret and, when the database's
// connections are given, an ingress rule to it.
func newGoFunction(scope constructs.Construct, id string, p goFunctionProps) awslambda.Function {
	env := map[string]*string{
		lambdaenv.DatabaseSecretARN: p.database.Secret.SecretArn(),
		lambdaenv.DatabaseSSLMode:   jsii.String(orDefault(p.database.SSLMode, "require")),
	}
	if p.database.MaxConns > 0 {
		env[lambdaenv.DatabaseMaxConns] = jsii.String(fmt.Sprint(p.database.MaxConns))
	}
	for k, v := range p.environment {
		env[k] = v
	}
	logs := awslogs.NewLogGroup(scope, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		Retention:     p.logRetention,
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	subnets := p.network.Subnets
	if subnets == nil {
		subnets = &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS}
	}
	sgs := p.network.SecurityGroups
	if len(sgs) == 0 {
		sgs = []awsec2.ISecurityGroup{awsec2.NewSecurityGroup(scope, jsii.String(id+"SecurityGroup"), &awsec2.SecurityGroupProps{
			Vpc:              p.network.Vpc,
			Description:      jsii.String("sluice " + p.description + ": no inbound; outbound to the database and AWS APIs"),
			AllowAllOutbound: jsii.Bool(true),
		})}
	}
	props := &awslambda.FunctionProps{
		Description:    jsii.String("sluice " + p.description),
		Runtime:        awslambda.Runtime_PROVIDED_AL2023(),
		Architecture:   awslambda.Architecture_ARM_64(),
		Handler:        jsii.String("bootstrap"),
		Code:           awslambda.Code_FromAsset(jsii.String(p.codeDir), nil),
		Timeout:        awscdk.Duration_Seconds(jsii.Number(p.timeout.Seconds())),
		MemorySize:     jsii.Number(float64(p.memoryMB)),
		Vpc:            p.network.Vpc,
		VpcSubnets:     subnets,
		SecurityGroups: &sgs,
		Environment:    &env,
		LogGroup:       logs,
	}
	if p.reservedConcurrency > 0 {
		props.ReservedConcurrentExecutions = jsii.Number(float64(p.reservedConcurrency))
	}
	fn := awslambda.NewFunction(scope, jsii.String(id), props)
	p.database.Secret.GrantRead(fn, nil)
	if p.database.Connections != nil {
		p.database.Connections.Connections().AllowDefaultPortFrom(fn, jsii.String("sluice "+p.description+" to PostgreSQL"))
	}
	return fn
}

// newKey creates a customer-managed KMS key with yearly rotation.
func newKey(scope constructs.Construct, id, description string) awskms.Key {
	return awskms.NewKey(scope, jsii.String(id), &awskms.KeyProps{
		Description:       jsii.String(description),
		EnableKeyRotation: jsii.Bool(true),
		RemovalPolicy:     awscdk.RemovalPolicy_RETAIN,
	})
}

// checkAssetDir reports a missing directory or a directory without a bootstrap file.
func checkAssetDir(field, dir string) error {
	if dir == "" {
		return fmt.Errorf("%s is required (a directory holding the Lambda's bootstrap executable)", field)
	}
	if _, err := os.Stat(filepath.Join(dir, "bootstrap")); err != nil {
		return fmt.Errorf("%s %q has no bootstrap file (run `make build`): %w", field, dir, err)
	}
	return nil
}

// invalid panics with every problem found in a construct's props; a panic is how CDK constructs
// fail synthesis.
func invalid(construct, id string, errs ...error) {
	if err := errors.Join(errs...); err != nil {
		panic(fmt.Errorf("sluice %s %q: invalid props:\n%w", construct, id, err))
	}
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func minutesCeil(d time.Duration) int {
	return int((d + time.Minute - 1) / time.Minute)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
