"""The learner's conventions, found by behaviour: layout, causality, mask convention, options, rotary, scale."""
