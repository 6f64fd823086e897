package doclint

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGeneralDocsNameEveryDestinationOrNone(t *testing.T) {
	found, err := Dir("testdata/outbox")
	require.NoError(t, err)
	var names []string
	for _, f := range found {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"Config.Topics", "Publish"}, names,
		"specific names (SNSLimit, Parse(SQSMessage), kafka.go's Flush), docs naming all four and unexported names pass")
	require.Equal(t, []string{"SNS"}, found[0].Named)
	require.Equal(t, []string{"EventBridge", "Kinesis", "Kafka"}, found[0].Missing)
}

func TestProse(t *testing.T) {
	named, missing := Prose("Publish committed outbox rows to SNS")
	require.Equal(t, []string{"SNS"}, named)
	require.Len(t, missing, 3)
	named, _ = Prose("to SNS, EventBridge, Kinesis or Kafka (MSK)")
	require.Len(t, named, 4)
	named, _ = Prose("queue depth of an SQS queue")
	require.Empty(t, named, "SQS is a source the outbox does not publish to")
}
