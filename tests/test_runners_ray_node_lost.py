"""A Ray worker node lost mid-run (issue 27 point 3): a local Ray cluster of a head that runs no
tasks and one worker node (ray.cluster_utils.Cluster: real raylets on this machine); the node is
removed while a campaign's run is on it and another joins. The run comes back as a transient
infrastructure failure ('killed'), the campaign retries it on the new node, and the trial is the
configuration's success, not its failure."""

import pytest

pytestmark = pytest.mark.slow  # a Ray cluster of two nodes takes tens of seconds to start here


def test_a_lost_ray_node_is_a_retried_infrastructure_failure_not_the_configs(tmp_path):
    pytest.importorskip("ray")
    from experiments.reliability.faults import ray_node_lost

    out = ray_node_lost(tmp_path)
    assert out["run_reached_the_node"] and out["runs"] == 2, out
    assert out["states"] == ["COMPLETE", "COMPLETE"], out
    assert out["attempts"][0] == 2, out  # the attempt lost with the node, then the retry on the new one
