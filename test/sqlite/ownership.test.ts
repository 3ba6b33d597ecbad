import { defineOwnershipSuite } from '../suites/ownership.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineOwnershipSuite(sqliteFixture);
