import { defineMaintenanceSuite } from '../suites/maintenance.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineMaintenanceSuite(sqliteFixture);
