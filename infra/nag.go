package infra

import (
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
)

// suppress records cdk-nag AwsSolutions suppressions on a construct and its children. Every
// suppression carries the reason it is acceptable; appliesTo narrows granular rules (IAM4, IAM5)
// to the exact finding.
func suppress(c constructs.IConstruct, id, reason string, appliesTo ...string) {
	s := &cdknag.NagPackSuppression{Id: jsii.String(id), Reason: jsii.String(reason)}
	if len(appliesTo) > 0 {
		applies := make([]any, len(appliesTo))
		for i, a := range appliesTo {
			applies[i] = a
		}
		s.AppliesTo = &applies
	}
	cdknag.NagSuppressions_AddResourceSuppressions(c, &[]*cdknag.NagPackSuppression{s}, jsii.Bool(true))
}

// suppressLambdaFindings suppresses the findings every sluice Lambda in a VPC has, on the
// function or on the role several functions share.
func suppressLambdaFindings(fn constructs.IConstruct) {
	suppress(fn, "AwsSolutions-IAM4",
		"AWSLambdaBasicExecutionRole (write the function's own logs) and AWSLambdaVPCAccessExecutionRole "+
			"(manage the function's ENIs, whose EC2 actions only exist on Resource *) are the AWS-maintained minimum for a Lambda in a VPC; "+
			"every sluice-specific permission is a scoped grant on the role's default policy.",
		"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
		"Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole")
}
