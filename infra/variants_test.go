package infra_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// exampleVariants are the example stack as operators deploy it: the defaults, each runtime,
// destination and option that changes what the hosts call or how they reach it. Every synth
// test that "walks the variants" walks these.
var exampleVariants = []struct {
	name  string
	props func(t *testing.T) *infra.SluiceStackProps
}{
	{"Default", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{AlarmEmail: "oncall@example.com"}
	}},
	{"FargateWAL", func(t *testing.T) *infra.SluiceStackProps { // the relay tasks follow the WAL
		return &infra.SluiceStackProps{NoAlarmDestination: true, RelayImageDir: imageDir(t), WALWakeup: true}
	}},
	{"FargateNatClaimCheck", func(t *testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, RelayImageDir: imageDir(t), NatGateways: 1, ClaimCheck: &infra.ClaimCheckProps{}}
	}},
	{"ClaimCheck", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, ClaimCheck: &infra.ClaimCheckProps{}}
	}},
	{"EventBridge", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, Destination: infra.DestinationEventBridge}
	}},
	{"Kinesis", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, Destination: infra.DestinationKinesis}
	}},
	{"Msk", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, Destination: infra.DestinationMSK}
	}},
	{"AsyncProxy", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, ConsumerCommitMode: infra.CommitAsync, ConsumerProxy: true}
	}},
	{"FifoNat", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, Fifo: true, NatGateways: 1}
	}},
	{"Fleet", func(*testing.T) *infra.SluiceStackProps {
		return &infra.SluiceStackProps{NoAlarmDestination: true, Fleet: 2}
	}},
}

// synthesizedVariant is one variant's stack and its template as written to the cloud assembly.
type synthesizedVariant struct {
	name  string
	stack infra.SluiceStack
	tmpl  assertions.Template
	file  string
}

var variantsCache []synthesizedVariant

// variants synthesizes every example variant once per test binary (in one app, with the
// cdk-nag AwsSolutions pack) and returns them in exampleVariants' order.
func variants(t *testing.T) []synthesizedVariant {
	t.Helper()
	if variantsCache != nil {
		return variantsCache
	}
	dir, err := os.MkdirTemp("", "sluice-variants-")
	require.NoError(t, err)
	assets, err := os.MkdirTemp("", "sluice-variant-assets-")
	require.NoError(t, err)
	// The asset directories outlive the test that first asks (the cache is the binary's).
	fn := func(name string) string {
		d := filepath.Join(assets, name)
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "bootstrap"), []byte("#!/bin/sh\n"), 0o755))
		return d
	}
	bundle := caBundle(t)
	b, err := os.ReadFile(bundle)
	require.NoError(t, err)
	bundle = filepath.Join(assets, "rds-ca-bundle.pem")
	require.NoError(t, os.WriteFile(bundle, b, 0o644))
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(dir)})
	var out []synthesizedVariant
	for _, v := range exampleVariants {
		p := v.props(t)
		if p.RelayImageDir != "" {
			img := filepath.Join(assets, "relay-service-"+v.name)
			require.NoError(t, os.Rename(p.RelayImageDir, img))
			p.RelayImageDir = img
		}
		p.RelayCodeDir, p.ConsumerCodeDir, p.MigrateCodeDir, p.CABundle = fn("relay"), fn("consumer"), fn("migrate"), bundle
		s := infra.NewSluiceStack(app, "Sluice"+v.name, p)
		withNag(s)
		out = append(out, synthesizedVariant{name: v.name, stack: s})
	}
	app.Synth(nil)
	for i := range out {
		out[i].file = filepath.Join(dir, "Sluice"+out[i].name+".template.json")
		raw, err := os.ReadFile(out[i].file)
		require.NoError(t, err)
		var doc map[string]any
		require.NoError(t, json.Unmarshal(raw, &doc))
		out[i].tmpl = assertions.Template_FromJSON(&doc, nil)
	}
	variantsCache = out
	return out
}

// cfn-lint (the CloudFormation linter, installed on these machines) checks every variant's
// template against the resource specifications (zero errors, only knownCfnLintWarnings), and
// cdk-nag's AwsSolutions pack finds nothing unsuppressed.
func TestEveryVariantPassesCfnLintAndNag(t *testing.T) {
	vs := variants(t)
	var files []string
	for _, v := range vs {
		t.Run(v.name+" cdk-nag", func(t *testing.T) { requireNoNagErrors(t, v.stack) })
		files = append(files, v.file)
	}
	requireCfnLintClean(t, files)
}

// Every interface endpoint in every variant carries a policy (an endpoint without one allows
// every call of every principal to every resource), and no statement of one allows every
// action or, beyond the two actions that have no resource, every resource.
func TestEveryEndpointHasAScopedPolicy(t *testing.T) {
	resourceless := map[string]bool{"secretsmanager:GetRandomPassword": true, "ecr:GetAuthorizationToken": true}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			eps := resources(v.tmpl, "AWS::EC2::VPCEndpoint")
			require.NotEmpty(t, eps)
			for id, r := range eps {
				doc, ok := props(r)["PolicyDocument"].(map[string]any)
				require.True(t, ok, "endpoint %s (%v) has no policy: it allows everything", id, props(r)["ServiceName"])
				require.NotEmpty(t, asList(doc["Statement"]), id)
				for _, s := range asList(doc["Statement"]) {
					st := s.(map[string]any)
					for _, a := range asList(st["Action"]) {
						action := a.(string)
						require.False(t, action == "*" || strings.HasSuffix(action, ":*"), "endpoint %s allows %s", id, action)
						for _, res := range asList(st["Resource"]) {
							require.False(t, res == "*" && !resourceless[action], "endpoint %s allows %s on every resource", id, action)
						}
					}
				}
			}
		})
	}
}

// host is a process of the stack that calls AWS and the database from the VPC: a function or
// the relay's Fargate task.
type host struct {
	name           string
	securityGroups []string // logical ids
	subnets        []any
	env            map[string]any
	relay          bool // publishes (its environment names its destinations)
	migrations     bool // answers CloudFormation's custom resource events
	container      map[string]any
}

// hostsOf lists the variant's hosts.
func hostsOf(t *testing.T, tmpl assertions.Template) []host {
	migrate := map[string]bool{}
	for _, r := range resources(tmpl, infra.MigrationsResourceType) {
		migrate[refID(props(r)["ServiceToken"])] = true
	}
	var hs []host
	for id, r := range resources(tmpl, "AWS::Lambda::Function") {
		p := props(r)
		vpc, ok := p["VpcConfig"].(map[string]any)
		if !ok || !strings.HasPrefix(fmt.Sprint(p["Description"]), "sluice ") {
			continue // CDK's providers, outside the VPC
		}
		h := host{name: id, subnets: asList(vpc["SubnetIds"]), env: env(r), migrations: migrate[id]}
		for _, sg := range asList(vpc["SecurityGroupIds"]) {
			h.securityGroups = append(h.securityGroups, refID(sg))
		}
		_, h.relay = h.env[lambdaenv.TopicARNs]
		hs = append(hs, h)
	}
	for id, r := range resources(tmpl, "AWS::ECS::Service") {
		p := props(r)
		vpc := p["NetworkConfiguration"].(map[string]any)["AwsvpcConfiguration"].(map[string]any)
		h := host{name: id, subnets: asList(vpc["Subnets"]), env: map[string]any{}}
		for _, sg := range asList(vpc["SecurityGroups"]) {
			h.securityGroups = append(h.securityGroups, refID(sg))
		}
		td := resources(tmpl, "AWS::ECS::TaskDefinition")[refID(p["TaskDefinition"])]
		require.NotNil(t, td)
		h.container = asList(props(td)["ContainerDefinitions"])[0].(map[string]any)
		for _, kv := range asList(h.container["Environment"]) {
			h.env[kv.(map[string]any)["Name"].(string)] = kv.(map[string]any)["Value"]
		}
		_, h.relay = h.env[lambdaenv.TopicARNs]
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].name < hs[j].name })
	return hs
}

// refsIn lists the logical ids a template value refers to (Ref, Fn::GetAtt, inside joins).
func refsIn(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		if id := refID(x); id != "" && !strings.HasPrefix(id, "AWS::") {
			return []string{id}
		}
		for _, e := range x {
			out = append(out, refsIn(e)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, refsIn(e)...)
		}
	}
	return out
}

// endpointFor returns the VPC endpoint whose service name ends in "."+service.
func endpointFor(tmpl assertions.Template, service string) (string, map[string]any) {
	for id, r := range resources(tmpl, "AWS::EC2::VPCEndpoint") {
		name := fmt.Sprint(props(r)["ServiceName"])
		if regexp.MustCompile(`\.` + regexp.QuoteMeta(service) + `(\]|$)`).MatchString(name) {
			return id, props(r)
		}
	}
	return "", nil
}

// endpointAllows reports whether an endpoint policy allows action on a resource that matches
// (match compares a statement's resource with what the host needs).
func endpointAllows(policy any, action string, match func(res any) bool) bool {
	doc, ok := policy.(map[string]any)
	if !ok {
		return false // no policy: the endpoint allows everything, which these tests refuse
	}
	for _, s := range asList(doc["Statement"]) {
		st := s.(map[string]any)
		if st["Effect"] != "Allow" || !reflect.DeepEqual(st["Principal"], map[string]any{"AWS": "*"}) && st["Principal"] != "*" {
			continue
		}
		for _, a := range asList(st["Action"]) {
			if a != action {
				continue
			}
			for _, r := range asList(st["Resource"]) {
				if match(r) {
					return true
				}
			}
		}
	}
	return false
}

// refersTo matches a resource naming logical id (its Ref, an attribute, or a join on them).
func refersTo(id string) func(any) bool {
	return func(res any) bool {
		for _, r := range refsIn(res) {
			if r == id {
				return true
			}
		}
		return false
	}
}

func containsText(text string) func(any) bool {
	return func(res any) bool { return strings.Contains(fmt.Sprint(res), text) }
}

// A synth test of what a deployment would do, per variant and per host: every AWS call a host
// makes goes to an interface endpoint that exists, whose policy allows that call on that
// resource, and that the host's security group may reach on 443; every S3 call goes through
// the gateway endpoint (routed for the host's subnets, allowed by its policy, reached by the
// S3 prefix list); and the host may reach the database. The Fargate relay also pulls its image
// (ECR API and registry, layers from ECR's bucket in S3) and writes its logs, and has a
// container health check; an MSK mapping's pollers reach Lambda and STS from the cluster's
// security group.
func TestEveryHostReachesWhatItCalls(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			tmpl := v.tmpl
			types := map[string]string{}
			for id, r := range (*tmpl.ToJSON())["Resources"].(map[string]any) {
				types[id] = r.(map[string]any)["Type"].(string)
			}
			endpointSG := firstKeyWithPrefix(resources(tmpl, "AWS::EC2::SecurityGroup"), "EndpointSecurityGroup")
			require.NotEmpty(t, endpointSG)
			_, s3 := endpointFor(tmpl, "s3")
			require.NotNil(t, s3, "the S3 gateway endpoint")
			s3Doc := s3["PolicyDocument"]
			routeTables := map[string]bool{}
			for _, rt := range asList(s3["RouteTableIds"]) {
				routeTables[refID(rt)] = true
			}
			subnetRouteTable := map[string]string{}
			for _, a := range resources(tmpl, "AWS::EC2::SubnetRouteTableAssociation") {
				subnetRouteTable[refID(props(a)["SubnetId"])] = refID(props(a)["RouteTableId"])
			}

			hosts := hostsOf(t, tmpl)
			require.NotEmpty(t, hosts)
			for _, h := range hosts {
				var egress []string
				for _, sg := range h.securityGroups {
					egress = append(egress, egressOfGroups(tmpl, sg)...)
				}
				need := func(service, action string, match func(any) bool, what string) {
					t.Helper()
					id, ep := endpointFor(tmpl, service)
					require.NotNil(t, ep, "%s: %s needs the %s endpoint", h.name, what, service)
					require.Equal(t, "Interface", ep["VpcEndpointType"], id)
					require.True(t, endpointAllows(ep["PolicyDocument"], action, match),
						"%s: the %s endpoint's policy must allow %s (%s)", h.name, service, action, what)
					require.Contains(t, egress, "sg:"+endpointSG+":443", "%s: HTTPS to the endpoints (%s)", h.name, what)
				}
				needS3 := func(action string, match func(any) bool, what string) {
					t.Helper()
					require.True(t, endpointAllows(s3Doc, action, match), "%s: the S3 endpoint's policy must allow %s (%s)", h.name, action, what)
					// S3's addresses are in its prefix list; HTTPS to any address (handler code
					// behind NAT) covers them too, through the same route.
					require.True(t, slices.Contains(egress, "s3-prefix-list:443") || slices.Contains(egress, "0.0.0.0/0:443"),
						"%s: HTTPS to S3's prefix list (%s): %v", h.name, what, egress)
					for _, sn := range h.subnets {
						require.True(t, routeTables[subnetRouteTable[refID(sn)]], "%s: subnet %s routes S3 to the gateway endpoint", h.name, refID(sn))
					}
				}

				// The database (or the RDS Proxy in front of it), on PostgreSQL's port.
				db := false
				for _, e := range egress {
					if strings.HasPrefix(e, "sg:DatabaseSecurityGroup") || strings.HasPrefix(e, "sg:ConsumerProxySecurityGroup") && strings.HasSuffix(e, ":5432") {
						db = true
					}
				}
				require.True(t, db, "%s reaches PostgreSQL: %v", h.name, egress)

				// Whatever the configuration names: secrets, destinations, the claim check.
				for _, id := range refsIn(h.env) {
					switch types[id] {
					case "AWS::SecretsManager::Secret":
						need("secretsmanager", "secretsmanager:GetSecretValue", refersTo(id), "its database secret")
					case "AWS::SNS::Topic":
						if h.relay {
							need("sns", "sns:Publish", refersTo(id), "publishing")
						}
					case "AWS::Events::EventBus":
						need("events", "events:PutEvents", refersTo(id), "putting events")
					case "AWS::Kinesis::Stream":
						need("kinesis-streams", "kinesis:PutRecords", refersTo(id), "putting records")
					case "AWS::S3::Bucket":
						if h.relay {
							needS3("s3:PutObject", refersTo(id), "storing payloads")
						} else {
							needS3("s3:GetObject", refersTo(id), "fetching payloads")
							needS3("s3:ListBucket", refersTo(id), "a missing payload reads 404")
						}
					case "AWS::MSK::ServerlessCluster":
						clusterSGs := asList(props(resources(tmpl, "AWS::MSK::ServerlessCluster")[id])["VpcConfigs"].([]any)[0].(map[string]any)["SecurityGroups"])
						require.Contains(t, egress, "sg:"+refID(clusterSGs[0])+":9098", "%s: the brokers' IAM port", h.name)
					}
				}
				if h.migrations {
					needS3("s3:PutObject", containsText("cloudformation-custom-resource-response-"), "answering CloudFormation")
				}
				if h.container != nil {
					image := fmt.Sprint(h.container["Image"])
					require.Contains(t, image, "container-assets")
					repo := containsText("container-assets")
					need("ecr.api", "ecr:GetAuthorizationToken", func(r any) bool { return r == "*" }, "pulling its image")
					need("ecr.api", "ecr:BatchGetImage", repo, "pulling its image")
					need("ecr.dkr", "ecr:GetDownloadUrlForLayer", repo, "pulling its image")
					need("ecr.dkr", "ecr:BatchGetImage", repo, "pulling its image")
					needS3("s3:GetObject", containsText("-starport-layer-bucket/*"), "ECR's image layers")
					logGroup := refID(h.container["LogConfiguration"].(map[string]any)["Options"].(map[string]any)["awslogs-group"])
					require.NotEmpty(t, logGroup)
					need("logs", "logs:CreateLogStream", refersTo(logGroup), "its log stream")
					need("logs", "logs:PutLogEvents", refersTo(logGroup), "its logs and metrics")
					hc, ok := h.container["HealthCheck"].(map[string]any)
					require.True(t, ok, "the relay container has a health check")
					require.Equal(t, []any{"CMD", "/relay", "-healthcheck"}, hc["Command"])
				}
			}

			// An MSK mapping's pollers, in the cluster's security group, invoke the consumer
			// as its role.
			for _, c := range resources(tmpl, "AWS::MSK::ServerlessCluster") {
				sg := refID(asList(props(c)["VpcConfigs"].([]any)[0].(map[string]any)["SecurityGroups"])[0])
				require.Contains(t, egressOfGroups(tmpl, sg), "sg:"+endpointSG+":443", "the pollers reach the endpoints")
				var consumer map[string]any
				for _, m := range resources(tmpl, "AWS::Lambda::EventSourceMapping") {
					consumer = resources(tmpl, "AWS::Lambda::Function")[refID(props(m)["FunctionName"])]
					_, lambda := endpointFor(tmpl, "lambda")
					require.NotNil(t, lambda)
					require.True(t, endpointAllows(lambda["PolicyDocument"], "lambda:InvokeFunction", refersTo(refID(props(m)["FunctionName"]))))
				}
				require.NotNil(t, consumer)
				_, sts := endpointFor(tmpl, "sts")
				require.NotNil(t, sts)
				require.True(t, endpointAllows(sts["PolicyDocument"], "sts:AssumeRole", refersTo(refID(props(consumer)["Role"]))))
			}
		})
	}
}

// egressOfGroups lists one security group's outbound rules as egressOf does.
func egressOfGroups(tmpl assertions.Template, sg string) []string {
	return egressOf(tmpl, map[string]any{"Properties": map[string]any{"VpcConfig": map[string]any{"SecurityGroupIds": []any{map[string]any{"Fn::GetAtt": []any{sg, "GroupId"}}}}}})
}

// With WALWakeup the relay tasks follow the WAL: the database decodes it and bounds what a slot
// may hold, the migrations give the relay's role the publication and the right to replicate,
// the tasks are told the publication, their replication connections are booked, and an alarm
// watches the slots' lag. The variants without it have none of this.
func TestWALWakeupVariantDeploysWhatTheStreamNeeds(t *testing.T) {
	for _, v := range variants(t) {
		wal := v.name == "FargateWAL"
		t.Run(v.name, func(t *testing.T) {
			params := v.tmpl.FindResources(jsii.String("AWS::RDS::DBParameterGroup"), nil)
			for _, res := range *params {
				p := (*res)["Properties"].(map[string]any)["Parameters"].(map[string]any)
				if wal {
					require.Equal(t, "1", p["rds.logical_replication"])
					require.Equal(t, "4096", p["max_slot_wal_keep_size"])
				} else {
					require.NotContains(t, p, "rds.logical_replication")
				}
			}
			raw, err := os.ReadFile(v.file)
			require.NoError(t, err)
			require.Equal(t, wal, regexp.MustCompile(`"WALPublication":\s*"sluice_outbox"`).MatchString(string(raw)), "the relay role's publication")
			require.Equal(t, wal, strings.Contains(string(raw), "SLUICE_RELAY_WAL_PUBLICATION"), "the tasks' variable")
			alarms := v.tmpl.FindResources(jsii.String("AWS::CloudWatch::Alarm"), &map[string]any{
				"Properties": map[string]any{"MetricName": "OldestReplicationSlotLag"}})
			require.Equal(t, wal, len(*alarms) == 1, "the replication slot lag alarm")
		})
	}
}
