import { defineLifecycleRaceSuite } from '../suites/lifecycle-race.suite.js';
import { postgresFixture } from '../support/dialects.js';

// 16 claimers on PostgreSQL: 8 processes with 2 connections each.
defineLifecycleRaceSuite(postgresFixture, 8, 2);
