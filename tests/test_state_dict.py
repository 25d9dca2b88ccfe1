"""disttest.bases.state_dict: upstream's common_state_dict names; the
VerifyStateDictMixin checks pass and fail as upstream's (one bug fixed), in
one process and over FSDP2 on 2 gloo ranks; the fusion models' state dicts."""

from __future__ import annotations

import unittest
from unittest import mock

import checkpoint_cases as cases
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
)
from torch.testing._internal.distributed import common_state_dict as upstream

import disttest.bases.state_dict as sd


def run(case: unittest.TestCase) -> unittest.TestResult:
    result = unittest.TestResult()
    case.run(result)
    return result


class Ours(sd.VerifyStateDictMixin, unittest.TestCase):
    def runTest(self):
        pass


class Theirs(upstream.VerifyStateDictMixin, unittest.TestCase):
    def runTest(self):
        pass


def trained():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optim.step()
    return model, optim


class NamesTest(unittest.TestCase):
    def test_every_upstream_name(self):
        names = {"VerifyStateDictMixin", "FusionEmbedding", "FusionEmbeddingWithHook",
                 "FusionEmbeddingWithModifier", "DTensor", "ShardedTensor", "StateDictOptions",
                 "set_state_dict"}
        self.assertLessEqual(names, set(sd.__all__))
        for name in sd.__all__:
            self.assertTrue(hasattr(upstream, name), name)
        for name in ("DTensor", "ShardedTensor", "StateDictOptions", "set_state_dict"):
            self.assertIs(getattr(sd, name), getattr(upstream, name), name)


class VerifyMsdTest(unittest.TestCase):
    def verdicts(self, msd, dist_msd, **kwargs):
        """(ours, upstream's): None when the check passes, else the message."""
        out = []
        for case in (Ours(), Theirs()):
            try:
                case._verify_msd(msd, dist_msd, **kwargs)
                out.append(None)
            except AssertionError as e:
                out.append(str(e))
        return out

    def test_same_values_pass(self):
        model, _ = trained()
        msd = model.state_dict()
        self.assertEqual(self.verdicts(msd, {k: v.clone() for k, v in msd.items()}), [None, None])
        self.assertEqual(self.verdicts(msd, msd, offload_to_cpu=True), [None, None])

    def test_a_different_value_names_its_key(self):
        model, _ = trained()
        msd = model.state_dict()
        dist_msd = {k: v.clone() for k, v in msd.items()}
        dist_msd["2.bias"] += 1
        ours, theirs = self.verdicts(msd, dist_msd)
        self.assertTrue(ours.startswith("2.bias has mismatched value"), ours)
        self.assertTrue(theirs.startswith("2.bias has mismatched value"), theirs)

    def test_missing_and_extra_keys_fail(self):
        model, _ = trained()
        msd = model.state_dict()
        fewer = dict(msd)
        del fewer["0.weight"]
        ours, theirs = self.verdicts(msd, fewer)
        self.assertIsNotNone(ours)
        self.assertIsNotNone(theirs)

    def test_ignore_frozen_params(self):
        model, _ = trained()
        model[0].weight.requires_grad_(False)
        msd = model.state_dict(keep_vars=True)
        options = StateDictOptions(ignore_frozen_params=True)
        without_frozen = {k: v for k, v in msd.items() if k != "0.weight"}
        self.assertEqual(self.verdicts(msd, without_frozen, options=options), [None, None])
        without_trainable = {k: v for k, v in msd.items() if k != "0.bias"}
        ours, theirs = self.verdicts(msd, without_trainable, options=options)
        self.assertIn("fqn='0.bias'", ours)
        self.assertIn("fqn='0.bias'", theirs)

    def test_not_a_tensor(self):
        with self.assertRaisesRegex(AssertionError, "expected a tensor, got list"):
            Ours()._compare_tensor(torch.ones(2), [1.0, 1.0])


class VerifyOsdTest(unittest.TestCase):
    def test_passes_on_the_distributed_form(self):
        model, optim = trained()
        dist_osd = get_optimizer_state_dict(model, optim)
        before = list(dist_osd["param_groups"])
        for case in (Ours(), Theirs()):
            case._verify_osd(model, optim, optim.state_dict(), dist_osd)
        self.assertEqual(dist_osd["param_groups"], before)

    def test_split_param_groups_are_merged(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        osd = optim.state_dict()
        dist_osd = get_optimizer_state_dict(model, optim)
        whole = dist_osd["param_groups"][0]
        halves = [dict(whole, params=whole["params"][:2]), dict(whole, params=whole["params"][2:])]
        dist_osd["param_groups"] = halves
        Ours()._verify_osd(model, optim, osd, dist_osd)
        self.assertIs(dist_osd["param_groups"], halves)

    def test_a_different_state_value_fails(self):
        # NB: upstream compares each state value with itself, so it misses this.
        model, optim = trained()
        osd = optim.state_dict()
        dist_osd = get_optimizer_state_dict(model, optim)
        states = dist_osd["state"]["2.weight"]
        dist_osd["state"]["2.weight"] = dict(states, exp_avg=states["exp_avg"] + 1)  # a copy: not optim's
        Ours()._verify_osd(model, optim, osd, get_optimizer_state_dict(model, optim))
        Theirs()._verify_osd(model, optim, osd, dist_osd)
        with self.assertRaisesRegex(AssertionError, "^2.weight: exp_avg: .*not close to the original"):
            Ours()._verify_osd(model, optim, osd, dist_osd)  # which parameter, which state

    def test_states_compare_on_the_cpu(self):
        # (upstream's compared nothing; a state kept on another device than
        # the plain one, cpu_offload's, must not make torch.allclose raise)
        model, optim = trained()
        dist_osd = get_optimizer_state_dict(model, optim)
        with mock.patch.object(Ours, "_compare_tensor") as compare:
            Ours()._verify_osd(model, optim, optim.state_dict(), dist_osd)
        self.assertTrue(compare.call_args_list)
        self.assertTrue(all(c.kwargs == {"offload_to_cpu": True} for c in compare.call_args_list),
                        compare.call_args_list)

    def test_a_different_hyperparameter_fails(self):
        model, optim = trained()
        dist_osd = get_optimizer_state_dict(model, optim)
        dist_osd["param_groups"][0]["lr"] = 0.5
        for case in (Ours(), Theirs()):
            with self.assertRaises(AssertionError):
                case._verify_osd(model, optim, optim.state_dict(), dist_osd)

    def test_by_load(self):
        model, optim = trained()
        dist_osd = get_optimizer_state_dict(model, optim)
        Ours()._verify_osd_by_load(model, optim, torch.optim.Adam(model.parameters(), lr=0.1), dist_osd)
        other, other_optim = trained()
        other(torch.ones(3, 4)).sum().backward()
        other_optim.step()  # one step more: other moments
        later = get_optimizer_state_dict(other, other_optim)
        with self.assertRaises(AssertionError):
            Ours()._verify_osd_by_load(model, optim, torch.optim.Adam(model.parameters(), lr=0.1), later)


class FusionModelsTest(unittest.TestCase):
    def test_keys_like_upstream(self):
        pairs = [(sd.FusionEmbedding, upstream.FusionEmbedding),
                 (sd.FusionEmbeddingWithHook, upstream.FusionEmbeddingWithHook),
                 (sd.FusionEmbeddingWithModifier, upstream.FusionEmbeddingWithModifier)]
        for ours, theirs in pairs:
            torch.manual_seed(0)
            a = ours(4, 2, 3)
            torch.manual_seed(0)
            b = theirs(4, 2, 3)
            self.assertEqual(list(a.state_dict()), list(b.state_dict()), ours.__name__)
            torch.testing.assert_close(a.state_dict(), b.state_dict())
        self.assertEqual(list(sd.FusionEmbeddingWithHook(4, 2, 3).state_dict()),
                         ["fusion_embedding.weight", "weight"])

    def test_hooks_map_keys_both_ways(self):
        outer = nn.Sequential(sd.FusionEmbeddingWithHook(4, 2, 3))
        self.assertEqual(sorted(outer.state_dict()), ["0.fusion_embedding.weight", "0.weight"])
        theirs = nn.Sequential(upstream.FusionEmbeddingWithHook(4, 2, 3))
        outer.load_state_dict(theirs.state_dict())
        torch.testing.assert_close(outer[0].embedding.weight, theirs[0].embedding.weight)

    def test_modifier_with_distributed_state_dict(self):
        self.assertEqual(sd.FusionEmbeddingWithModifier(4, 2, 3)._fqn_modifiers(), {"weight": "embedding"})
        model = sd.FusionEmbeddingWithModifier(4, 2, 3)
        msd = get_model_state_dict(model)
        self.assertEqual(sorted(msd), ["fusion_embedding.weight", "weight"])
        other = sd.FusionEmbeddingWithModifier(4, 2, 3)
        set_model_state_dict(other, msd)
        Ours()._verify_msd(msd, other.state_dict())


class RanksTest(unittest.TestCase):
    """FSDP2 on 2 gloo ranks: DTensor state dicts checked by the mixin, and a
    distributed checkpoint round trip into a fresh sharded model."""

    def ok(self, name):
        result = run(cases.StateDicts(name))
        self.assertEqual([text for _, text in result.failures + result.errors], [])
        self.assertEqual(result.skipped, [])

    def test_verify(self):
        self.ok("test_verify")

    def test_mismatch(self):
        self.ok("test_mismatch")

    def test_sharded_tensor(self):
        self.ok("test_sharded_tensor")

    def test_dcp_roundtrip_verified(self):
        self.ok("test_dcp_roundtrip_verified")


if __name__ == "__main__":
    unittest.main()
