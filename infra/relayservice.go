package infra

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsecs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslogs"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
	sluiceoutbox "github.com/sluicehq/sluice/pkg/outbox"
)

// DefaultRelayServiceCABundlePath is RelayServiceProps.CABundlePath's default: where the image
// `make build` writes (bin/relay-service) holds the RDS CA bundle.
const DefaultRelayServiceCABundlePath = "/etc/sluice/rds-ca-bundle.pem"

// RelayServiceProps run the relay as an ECS Fargate service (examples/relay: a long-running
// process, SIGTERM finishes its rounds) instead of the scheduled Lambda, for teams whose relay
// must run continuously. The relay's settings, destinations, claim check and database role are
// the same as the Lambda's.
type RelayServiceProps struct {
	// Image is the relay's container image for linux/arm64: examples/relay built with the RDS CA
	// bundle at CABundlePath. `make build` writes one to bin/relay-service (with its Dockerfile):
	// awsecs.ContainerImage_FromAsset(jsii.String("bin/relay-service"), nil). Its container
	// health check runs `/relay -healthcheck` (examples/relay probes its own /healthz): an
	// image of your own answers that command. Required.
	Image awsecs.ContainerImage
	// CABundlePath is where Image holds the RDS CA bundle (DATABASE_SSLROOTCERT). Defaults to
	// DefaultRelayServiceCABundlePath.
	CABundlePath string
	// DesiredCount is how many relay tasks run. Relays share the work safely (each round holds
	// its keys' advisory locks), and a second task keeps publishing while one is replaced.
	// Defaults to 2.
	DesiredCount int
	// CPU is the task's CPU units (256, 512, 1024, 2048 or 4096). Defaults to 512.
	CPU int
	// MemoryMiB is the task's memory, valid for CPU on Fargate; GOMEMLIMIT is 90% of it, and the
	// relay's per-round payload budget follows it as the Lambda's follows the function's
	// memory. Defaults to 1024.
	MemoryMiB int
	// Cluster runs the service. Defaults to a new cluster in Network.Vpc with Container Insights.
	Cluster awsecs.ICluster
	// WALPublication, when set, has the tasks follow the WAL for new rows through this
	// publication instead of polling (SLUICE_RELAY_WAL_PUBLICATION; docs/outbox.md, "WAL
	// wake-up"), on one replication connection per task beside the pool. The database needs
	// rds.logical_replication=1; with OutboxProps.Migrations the relay's role gets the
	// publication and rds_replication. Defaults to "": the tasks poll.
	WALPublication string
}

func (p *RelayServiceProps) withDefaults() RelayServiceProps {
	out := *p
	out.CABundlePath = orDefault(out.CABundlePath, DefaultRelayServiceCABundlePath)
	out.DesiredCount = orDefault(out.DesiredCount, 2)
	out.CPU = orDefault(out.CPU, 512)
	out.MemoryMiB = orDefault(out.MemoryMiB, 1024)
	return out
}

func (p *RelayServiceProps) validate() error {
	var errs []error
	if p.Image == nil {
		errs = append(errs, errors.New("RelayService.Image is required (make build writes bin/relay-service: awsecs.ContainerImage_FromAsset)"))
	}
	if p.WALPublication != "" && !pgIdentifier.MatchString(p.WALPublication) {
		errs = append(errs, fmt.Errorf("RelayService.WALPublication must be a lower-case PostgreSQL identifier, got %q", p.WALPublication))
	}
	if p.DesiredCount < 1 || p.DesiredCount > 16 {
		errs = append(errs, fmt.Errorf("RelayService.DesiredCount must be between 1 and 16, got %d", p.DesiredCount))
	}
	switch p.CPU {
	case 256, 512, 1024, 2048, 4096:
	default:
		errs = append(errs, fmt.Errorf("RelayService.CPU must be 256, 512, 1024, 2048 or 4096 (Fargate's task sizes), got %d", p.CPU))
	}
	if p.MemoryMiB < 512 {
		errs = append(errs, fmt.Errorf("RelayService.MemoryMiB must be at least 512, got %d", p.MemoryMiB))
	}
	return errors.Join(errs...)
}

// newRelayService creates the relay's Fargate service with env (the relay's settings and
// destinations) and returns it as the relayHost the grants go to.
func newRelayService(scope constructs.Construct, p *OutboxProps, env map[string]*string, secret awssecretsmanager.ISecret) serviceRelay {
	s := p.RelayService.withDefaults()
	if secret == nil {
		secret = p.Database.Secret
	}
	cluster := s.Cluster
	if cluster == nil {
		cluster = awsecs.NewCluster(scope, jsii.String("RelayCluster"), &awsecs.ClusterProps{
			Vpc:                 p.Network.Vpc,
			ContainerInsightsV2: awsecs.ContainerInsights_ENABLED,
		})
	}
	task := awsecs.NewFargateTaskDefinition(scope, jsii.String("RelayTask"), &awsecs.FargateTaskDefinitionProps{
		Cpu:            jsii.Number(float64(s.CPU)),
		MemoryLimitMiB: jsii.Number(float64(s.MemoryMiB)),
		RuntimePlatform: &awsecs.RuntimePlatform{
			CpuArchitecture:       awsecs.CpuArchitecture_ARM64(),
			OperatingSystemFamily: awsecs.OperatingSystemFamily_LINUX(),
		},
	})
	full := processEnvironment(secret, p.Database, s.MemoryMiB)
	// The pool is booked per task: the relay sizes it from DATABASE_MAX_CONNS.
	full[lambdaenv.DatabaseMaxConns] = jsii.String(strconv.Itoa(p.Database.maxConns()))
	full[lambdaenv.DatabaseSSLRootCert] = jsii.String(s.CABundlePath)
	if s.WALPublication != "" {
		full[lambdaenv.RelayWALPublication] = jsii.String(s.WALPublication)
	}
	for k, v := range env {
		full[k] = v
	}
	logs := awslogs.NewLogGroup(scope, jsii.String("RelayServiceLogs"), &awslogs.LogGroupProps{
		Retention:     p.LogRetention,
		RemovalPolicy: awscdk.RemovalPolicy_RETAIN,
	})
	// SIGTERM stops taking rounds and lets the ones in flight end; a round holds its keys at
	// most Lease, so the task gets that long (and its settle) before SIGKILL, within ECS's 120 s.
	lease := sluiceoutbox.RelaySetting("Lease").Default
	if p.Relay.Lease > 0 {
		lease = int64(p.Relay.Lease)
	}
	stop := min(120, int(lease/1e9)+15)
	container := task.AddContainer(jsii.String("relay"), &awsecs.ContainerDefinitionOptions{
		Image:                  s.Image,
		Essential:              jsii.Bool(true),
		Environment:            &full,
		Logging:                awsecs.LogDriver_AwsLogs(&awsecs.AwsLogDriverProps{StreamPrefix: jsii.String("relay"), LogGroup: logs}),
		StopTimeout:            awscdk.Duration_Seconds(jsii.Number(float64(stop))),
		ReadonlyRootFilesystem: jsii.Bool(true),
		// The image is distroless (no shell, no curl): the relay binary probes its own
		// liveness endpoint (examples/relay, /healthz). A task that stops answering is replaced,
		// and a deployment whose tasks never turn healthy rolls back (the circuit breaker).
		HealthCheck: &awsecs.HealthCheck{
			Command:     jsii.Strings("CMD", "/relay", "-healthcheck"),
			Interval:    awscdk.Duration_Seconds(jsii.Number(30)),
			Timeout:     awscdk.Duration_Seconds(jsii.Number(5)),
			Retries:     jsii.Number(3),
			StartPeriod: awscdk.Duration_Seconds(jsii.Number(60)),
		},
	})
	subnets, sgs, ownSG := placement(scope, "RelayService", p.Network, "outbox relay service")
	service := awsecs.NewFargateService(scope, jsii.String("RelayService"), &awsecs.FargateServiceProps{
		Cluster:        cluster,
		TaskDefinition: task,
		DesiredCount:   jsii.Number(float64(s.DesiredCount)),
		// Never more tasks than DesiredCount (the connection budget books that many); during a
		// deployment one task at a time is replaced.
		MaxHealthyPercent: jsii.Number(100),
		MinHealthyPercent: jsii.Number(float64(100 * (s.DesiredCount - 1) / s.DesiredCount)),
		CircuitBreaker:    &awsecs.DeploymentCircuitBreaker{Rollback: jsii.Bool(true)},
		VpcSubnets:        subnets,
		SecurityGroups:    &sgs,
		AssignPublicIp:    jsii.Bool(false),
	})
	secret.GrantRead(task.TaskRole(), nil)
	// Fargate pulls the image's layers from ECR's bucket in S3 (through the gateway endpoint
	// in private subnets), whether or not the relay stores claim-check payloads there.
	s3 := "ECR's image layers"
	if p.ClaimCheck != nil {
		s3 += ", the claim check's payloads"
	}
	allowDatabaseAndAPIs(service, p.Database, nil, ownSG, p.Network, "outbox relay service", s3, false)
	suppress(task, "AwsSolutions-ECS2",
		"The relay's environment holds its settings, topic ARNs and the ARN of its database secret, nothing secret: "+
			"the relay reads the secret's value from Secrets Manager itself (and again when a connection fails, for rotation).")
	suppress(task, "AwsSolutions-IAM5",
		"The execution role's ECR and CloudWatch Logs statements are CDK's (GetAuthorizationToken has no resource); "+
			"publishing to a KMS-encrypted topic needs kms:GenerateDataKey*, limited to the topic keys' ARNs.")
	return serviceRelay{task: task, container: container, service: service, logs: logs}
}
