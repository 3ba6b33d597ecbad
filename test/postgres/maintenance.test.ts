import { defineMaintenanceSuite } from '../suites/maintenance.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineMaintenanceSuite(postgresFixture);
